"""Strict (GenEval-style) accuracy of a tiny text-to-image model on a shapes prompt set.

The one measurement of sample quality the embedded world's pretraining is judged by (the floor in
docs/embedded-world.md): every prompt drawn `seeds` times from the harness's eval noise stream, the
images scored by the programmatic detector, per skill and overall, unguided and at each CFG scale.
`scripts/pretrain_tiny.py` (its --eval and its training log) and `scripts/measure_tiny.py` call it.
"""

from __future__ import annotations

import numpy as np
import torch


@torch.no_grad()
def evaluate(model, prompt_set: str = "shapes/heldout", seeds: int = 4, steps: int = 10,
             guidances: tuple[float | None, ...] = (None, 2.0, 3.0), shift: float | None = None) -> dict:
    """Strict (GenEval-style) accuracy and graded score per skill, with and without CFG.

    `model` is a `solbench.models.tiny.TinyT2I`. Noise comes from the harness's eval stream
    (solbench.engine.noise, run seed 0), so these samples are the ones a step-0 evaluation of an RL run on
    this prompt set sees. Overall accuracy is the mean over skills (GenEval's convention);
    `image_accuracy` weights every image equally.
    """
    from solbench.engine.noise import candidate_noise
    from solbench.world.detector import score_images
    from solbench.world.prompts import load_prompt_set

    records = load_prompt_set(prompt_set)
    ids = [r.id for r in records for _ in range(seeds)]
    texts = [r.text for r in records for _ in range(seeds)]
    skills = [r.skill for r in records for _ in range(seeds)]
    noise, _ = candidate_noise(0, "eval", ids, [i % seeds for i in range(len(ids))], model.config.latent_shape)
    shift = model.config.shift if shift is None else shift
    results = {"prompt_set": prompt_set, "seeds_per_prompt": seeds, "steps": steps, "shift": shift, "by_guidance": {}}
    for guidance in guidances:
        images = torch.cat([model.generate(texts[i:i + 128], noise[i:i + 128], steps, guidance, shift=shift)
                            for i in range(0, len(texts), 128)])
        strict = score_images(images, texts, strict=True)
        graded = score_images(images, texts, strict=False)
        per_skill = {}
        for skill in dict.fromkeys(skills):
            idx = [i for i, s in enumerate(skills) if s == skill]
            per_skill[skill] = {"strict": round(float(strict[idx].mean()), 4), "graded": round(float(graded[idx].mean()), 4)}
        results["by_guidance"]["none" if guidance is None else f"cfg{guidance:g}"] = {
            "accuracy": round(float(np.mean([v["strict"] for v in per_skill.values()])), 4),
            "image_accuracy": round(float(strict.mean()), 4),
            "graded": round(float(graded.mean()), 4),
            "per_skill": per_skill,
        }
    return results
