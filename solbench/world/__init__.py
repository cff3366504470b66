"""The embedded "shapes" world: a text-to-image task small enough for two CPU cores.

- scenes: structured scene specs (`SceneSpec`, `ObjectSpec`) and their anti-aliased 32x32 render.
- grammar: GenEval-style skills, captions, `parse_prompt`, scene sampling, hard negatives.
- detector: the programmatic judge (strict 0/1 and graded scores) behind the shapes rewards.
- prompts: the versioned train/eval/heldout prompt sets and `load_prompt_set`.

See docs/embedded-world.md for the design and the measured numbers.

Stage ``world`` (solbench/stages.py): it imports its own modules and the stages below it, report, results, machine,
text, base.
"""

from solbench.world.grammar import Requirements, caption, parse_prompt
from solbench.world.prompts import PromptRecord, load_prompt_set
from solbench.world.scenes import ObjectSpec, SceneSpec, render_batch, render_scene

__all__ = [
    "ObjectSpec",
    "PromptRecord",
    "Requirements",
    "SceneSpec",
    "caption",
    "load_prompt_set",
    "parse_prompt",
    "render_batch",
    "render_scene",
]
