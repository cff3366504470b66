"""The caption grammar of the shapes world: requirements, captions, a parser and scene sampling.

A prompt is a `Requirements` object (what a correct image must contain); `caption` writes it as text
and `parse_prompt` reads text back, so rewards can take plain prompt strings. The four skills follow
GenEval's (Ghosh et al., 2023) on a closed vocabulary:

| skill         | caption form                               | a correct image has                    |
|---------------|--------------------------------------------|----------------------------------------|
| single_object | "a red circle"                             | at least one red circle                |
| counting      | "three red circles" (two, three, four)     | exactly three red circles              |
| color_attr    | "a blue square and a yellow triangle"      | both objects, each in its own colour   |
| position      | "a green circle left of a red square"      | both, in that relation (GenEval's rule) |

As in GenEval, only counting prompts fix an exact number; other objects in the image are ignored.
Colour attribution pairs differ in colour and in shape (so a swapped binding is wrong); position
pairs are any two different (colour, shape) classes. Relations use GenEval's test on centres
(see solbench.world.detector.relations).

`sample_scene(requirements, rng)` draws a scene that is exactly the caption (no extra objects) for
pretraining and tests; `sample_requirements(rng)` draws a random prompt from the grammar.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass

import numpy as np

from solbench.errors import SolbenchError
from solbench.world.scenes import (
    BACKGROUND_LEVELS,
    BORDER,
    COLOURS,
    MAX_SIZE,
    MIN_GAP,
    MIN_SIZE,
    RESOLUTION,
    SHAPES,
    ObjectSpec,
    SceneSpec,
    jittered_rgb,
)

SKILLS: tuple[str, ...] = ("single_object", "counting", "color_attr", "position")
NUMBER_WORDS: dict[int, str] = {2: "two", 3: "three", 4: "four"}
RELATIONS: tuple[str, ...] = ("left of", "right of", "above", "below")
# The same relation seen from the other object: "A left of B" is "B right of A".
INVERSE_RELATION = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}
# Unit direction of the subject relative to the reference object (image y points down).
RELATION_DIRECTION = {"left of": (-1.0, 0.0), "right of": (1.0, 0.0), "above": (0.0, -1.0), "below": (0.0, 1.0)}
# Scenes drawn for a position prompt keep the pair within this angle of the relation's axis, well
# inside GenEval's acceptance cone (about 60 degrees), so ground truth is never borderline.
POSITION_MAX_ANGLE_DEG = 30.0


class PromptParseError(SolbenchError):
    """A prompt is not in the shapes grammar (so shapes rewards cannot judge it)."""


@dataclass(frozen=True)
class ObjectRequirement:
    colour: str
    shape: str
    count: int = 1
    exact: bool = False  # True: exactly `count` such objects (counting); False: at least `count`


@dataclass(frozen=True)
class Relation:
    subject: int  # index into Requirements.objects
    relation: str  # one of RELATIONS
    reference: int


@dataclass(frozen=True)
class Requirements:
    skill: str
    objects: tuple[ObjectRequirement, ...]
    relation: Relation | None = None

    @property
    def n_checks(self) -> int:
        """How many separate requirements a graded score averages over."""
        return len(self.objects) + (self.relation is not None)

    def canonical_key(self) -> tuple:
        """Identity up to wording: "A and B" == "B and A", "A left of B" == "B right of A"."""
        if self.skill == "color_attr":
            return (self.skill, tuple(sorted((o.colour, o.shape) for o in self.objects)))
        if self.skill == "position" and self.relation is not None:
            rel = self.relation
            a, b = self.objects[rel.subject], self.objects[rel.reference]
            name = rel.relation
            if name in ("right of", "below"):
                a, b, name = b, a, INVERSE_RELATION[name]
            return (self.skill, (a.colour, a.shape), name, (b.colour, b.shape))
        return (self.skill, tuple((o.colour, o.shape, o.count, o.exact) for o in self.objects))


def _plural(shape: str) -> str:
    return shape + "s"


def caption(req: Requirements) -> str:
    """The prompt text of a requirement set (inverse of parse_prompt)."""
    objs = req.objects
    if req.skill == "single_object":
        return f"a {objs[0].colour} {objs[0].shape}"
    if req.skill == "counting":
        return f"{NUMBER_WORDS[objs[0].count]} {objs[0].colour} {_plural(objs[0].shape)}"
    if req.skill == "color_attr":
        return f"a {objs[0].colour} {objs[0].shape} and a {objs[1].colour} {objs[1].shape}"
    if req.skill == "position":
        rel = req.relation
        a, b = objs[rel.subject], objs[rel.reference]
        return f"a {a.colour} {a.shape} {rel.relation} a {b.colour} {b.shape}"
    raise ValueError(f"unknown skill {req.skill!r}; known skills: {', '.join(SKILLS)}")


_C = "(" + "|".join(COLOURS) + ")"
_S = "(" + "|".join(SHAPES) + ")"
_N = "(" + "|".join(NUMBER_WORDS.values()) + ")"
_R = "(" + "|".join(RELATIONS) + ")"
_PATTERNS = {
    "single_object": re.compile(rf"^an? {_C} {_S}$"),
    "counting": re.compile(rf"^{_N} {_C} {_S}s$"),
    "color_attr": re.compile(rf"^an? {_C} {_S} and an? {_C} {_S}$"),
    "position": re.compile(rf"^an? {_C} {_S} {_R} an? {_C} {_S}$"),
}
_WORD_TO_NUMBER = {w: n for n, w in NUMBER_WORDS.items()}


def normalise_prompt(text: str) -> str:
    """Lower case, single spaces, no trailing full stop, no leading "a photo of"."""
    text = " ".join(text.lower().strip().rstrip(".").split())
    return text.removeprefix("a photo of ").removeprefix("an image of ")


def parse_prompt(text: str) -> Requirements:
    """Requirements of a shapes-world prompt; PromptParseError names the accepted forms otherwise."""
    norm = normalise_prompt(text)
    for skill, pattern in _PATTERNS.items():
        m = pattern.match(norm)
        if not m:
            continue
        g = m.groups()
        if skill == "single_object":
            return Requirements(skill, (ObjectRequirement(g[0], g[1]),))
        if skill == "counting":
            return Requirements(skill, (ObjectRequirement(g[1], g[2], _WORD_TO_NUMBER[g[0]], exact=True),))
        if skill == "color_attr":
            return Requirements(skill, (ObjectRequirement(g[0], g[1]), ObjectRequirement(g[2], g[3])))
        return Requirements(
            skill, (ObjectRequirement(g[0], g[1]), ObjectRequirement(g[3], g[4])), Relation(0, g[2], 1)
        )
    from solbench.text.bounded_text import clip_repr  # a prompt from a file of any length: its message stays short

    raise PromptParseError(
        f"prompt {clip_repr(text)} is not in the shapes grammar. Accepted forms: 'a <colour> <shape>', "
        f"'<two|three|four> <colour> <shape>s', 'a <colour> <shape> and a <colour> <shape>', "
        f"'a <colour> <shape> <left of|right of|above|below> a <colour> <shape>' with colours "
        f"{', '.join(COLOURS)} and shapes {', '.join(SHAPES)}."
    )


def enumerate_requirements(skill: str) -> list[Requirements]:
    """Every prompt of one skill in a fixed order (all surface forms, including equivalent ones)."""
    classes = [(c, s) for c in COLOURS for s in SHAPES]
    out: list[Requirements] = []
    if skill == "single_object":
        out = [Requirements(skill, (ObjectRequirement(c, s),)) for c, s in classes]
    elif skill == "counting":
        out = [
            Requirements(skill, (ObjectRequirement(c, s, n, exact=True),))
            for n in NUMBER_WORDS for c, s in classes
        ]
    elif skill == "color_attr":
        out = [
            Requirements(skill, (ObjectRequirement(*a), ObjectRequirement(*b)))
            for a, b in itertools.permutations(classes, 2)
            if a[0] != b[0] and a[1] != b[1]
        ]
    elif skill == "position":
        out = [
            Requirements(skill, (ObjectRequirement(*a), ObjectRequirement(*b)), Relation(0, r, 1))
            for a, b in itertools.permutations(classes, 2)
            for r in RELATIONS
        ]
    else:
        raise ValueError(f"unknown skill {skill!r}; known skills: {', '.join(SKILLS)}")
    return out


def sample_requirements(rng: np.random.Generator, skill: str | None = None) -> Requirements:
    """A random prompt of the grammar (skill uniform when not given, then uniform within the skill)."""
    skill = skill if skill is not None else SKILLS[int(rng.integers(len(SKILLS)))]
    options = _ENUMERATED[skill]
    return options[int(rng.integers(len(options)))]


_ENUMERATED = {skill: enumerate_requirements(skill) for skill in SKILLS}


# ---------------------------------------------------------------------------------------------
# Scene sampling


class SceneSamplingError(RuntimeError):
    """Placement failed repeatedly (a bug in the placement bounds, not a user error)."""


_CANDIDATES = 64  # positions drawn at once per object; the first that fits is taken


def _place(rng, classes: list[tuple[str, str]], resolution: int, cone: tuple[int, int, str] | None = None) -> list[ObjectSpec]:
    """Objects of the given classes at random positions at least MIN_GAP apart.

    Candidates are drawn in vectorised batches and the first that fits is kept. `cone` =
    (subject, reference, relation) keeps the subject within POSITION_MAX_ANGLE_DEG of the
    relation's direction from the reference (the reference is placed first). Repeated failure
    restarts with a smaller size range: four 12 px objects leave little room in 32 px.
    """
    order = list(range(len(classes)))
    if cone is not None:
        subject, reference, relation = cone
        order = [reference, subject] + [i for i in order if i not in (subject, reference)]
        ux, uy = RELATION_DIRECTION[relation]
        cos_max = math.cos(math.radians(POSITION_MAX_ANGLE_DEG))
    for attempt in range(100):
        max_size = max(MIN_SIZE, MAX_SIZE - 0.1 * attempt)
        placed: dict[int, tuple[float, float, float]] = {}
        for i in order:
            size = rng.uniform(MIN_SIZE, max_size, _CANDIDATES)
            lo = BORDER + size / 2
            cx = lo + (resolution - 2 * lo) * rng.random(_CANDIDATES)
            cy = lo + (resolution - 2 * lo) * rng.random(_CANDIDATES)
            ok = np.ones(_CANDIDATES, dtype=bool)
            for s, x, y in placed.values():
                gap = np.maximum(np.abs(cx - x), np.abs(cy - y)) - (size + s) / 2
                ok &= gap >= MIN_GAP
            if cone is not None and i == subject:
                _, rx, ry = placed[reference]
                dx, dy = cx - rx, cy - ry
                ok &= dx * ux + dy * uy >= cos_max * np.hypot(dx, dy)
            if not ok.any():
                break
            k = int(ok.argmax())
            placed[i] = (float(size[k]), float(cx[k]), float(cy[k]))
        if len(placed) == len(classes):
            return [ObjectSpec(shape, colour, *placed[i], jittered_rgb(colour, rng))
                    for i, (colour, shape) in enumerate(classes)]
    raise SceneSamplingError(f"could not place {len(classes)} objects in a {resolution}px scene")


def sample_scene(req: Requirements, rng: np.random.Generator, resolution: int = RESOLUTION) -> SceneSpec:
    """A scene that shows exactly the prompt's objects (and relation), drawn from `rng`."""
    classes = [(o.colour, o.shape) for o in req.objects for _ in range(o.count)]
    background = float(rng.uniform(*BACKGROUND_LEVELS))
    rel = req.relation
    cone = None if rel is None else (rel.subject, rel.reference, rel.relation)  # one object per requirement
    objects = _place(rng, classes, resolution, cone)
    order = rng.permutation(len(objects))  # draw order carries no meaning
    return SceneSpec(tuple(objects[i] for i in order), background, resolution)


def sample_training_pair(rng: np.random.Generator, resolution: int = RESOLUTION) -> tuple[SceneSpec, str]:
    """One pretraining example: a random prompt of the grammar and a scene showing it."""
    req = sample_requirements(rng)
    return sample_scene(req, rng, resolution), caption(req)


# ---------------------------------------------------------------------------------------------
# Hard negatives: a caption one attribute away from the truth (tiny CLIP training and tests)


def _other(options, current, rng):
    choices = [o for o in options if o != current]
    return choices[int(rng.integers(len(choices)))]


def _recolour(obj: ObjectRequirement, rng) -> ObjectRequirement:
    return ObjectRequirement(_other(list(COLOURS), obj.colour, rng), obj.shape, obj.count, obj.exact)


def _reshape(obj: ObjectRequirement, rng) -> ObjectRequirement:
    return ObjectRequirement(obj.colour, _other(SHAPES, obj.shape, rng), obj.count, obj.exact)


def hard_negative(req: Requirements, rng: np.random.Generator) -> Requirements:
    """A prompt that differs from `req` in one attribute, so an image of `req` does not match it.

    Count changes (counting), colour and shape changes, swapped colour bindings (colour
    attribution and position), and reversed relations or swapped roles (position).
    """
    objs = list(req.objects)
    if req.skill in ("single_object", "counting"):
        o = objs[0]
        kind = int(rng.integers(3))
        if kind == 0:  # a different number: 1 is the single-object form
            n = _other([1, *NUMBER_WORDS], o.count, rng)
            return Requirements("single_object", (ObjectRequirement(o.colour, o.shape),)) if n == 1 else \
                Requirements("counting", (ObjectRequirement(o.colour, o.shape, n, exact=True),))
        return Requirements(req.skill, ((_recolour if kind == 1 else _reshape)(o, rng),))
    a, b = objs
    kind = int(rng.integers(4 if req.skill == "position" else 3))
    if kind == 0 and a.colour != b.colour:  # swap the colour binding
        new = (ObjectRequirement(b.colour, a.shape), ObjectRequirement(a.colour, b.shape))
    elif kind == 3 or (kind == 0 and req.skill == "position"):  # reverse the relation
        rel = req.relation
        return Requirements(req.skill, req.objects, Relation(rel.subject, INVERSE_RELATION[rel.relation], rel.reference))
    else:
        which = int(rng.integers(2))
        changed = (_recolour if kind == 1 or kind == 0 else _reshape)(objs[which], rng)
        new = tuple(changed if i == which else o for i, o in enumerate(objs))
    if req.skill == "color_attr" and (new[0].colour == new[1].colour or new[0].shape == new[1].shape):
        # Leaving the colour-attribution form would make the negative trivially different; try again.
        return hard_negative(req, rng)
    if req.skill == "position" and (new[0].colour, new[0].shape) == (new[1].colour, new[1].shape):
        return hard_negative(req, rng)
    return Requirements(req.skill, new, req.relation)
