"""Prompt sets: fixed, versioned lists of prompts (JSONL in solbench/world/prompts/) and their loader.

The shapes world ships three disjoint sets built from the whole grammar by `build_shapes_splits`:
"shapes/train" (RL training prompts), "shapes/eval" (evaluation during runs, for tuning) and
"shapes/heldout" (final numbers, never tuned on). Splits are disjoint up to wording: "A and B" and
"B and A", or "A left of B" and "B right of A", count as one prompt group, and each group appears
once (in one random wording) in at most one split. eval and heldout have the same number of prompts
per skill (EVAL_PER_SKILL), so per-skill accuracies are comparable; the remaining groups are train
(position capped at TRAIN_CAP_PER_SKILL). "shapes/draw<SEED>" is a fresh draw from the grammar outside eval
and heldout (`grammar_draw`), for measurements on prompts no choice was tuned on. Pretraining (scripts/pretrain_tiny.py) draws from the whole grammar, like a base model that
has seen every kind of caption; the splits exist for RL.

`load_prompt_set` also reads any .txt file (one prompt per line) or .jsonl file (records with
"text" and optional "id", "skill"), e.g. the PickScore prompt split on a cluster. Files are read as
UTF-8 (a leading byte-order mark is dropped), whatever the machine's locale: the Pick-a-Pic prompts
are not ASCII. Ids are what the noise seeds and the candidates table key on, so they must be unique
within a set; docs/real-models.md, "Prompt sets", gives the exact formats.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from solbench.text.bounded_text import clip, clip_repr, decode_text, read_at_most
from solbench.errors import ConfigError

SPLIT_VERSION = 1  # bump when the split rule or the grammar changes (the files record it)
SPLITS = ("train", "eval", "heldout")
EVAL_PER_SKILL = {"single_object": 3, "counting": 9, "color_attr": 9, "position": 12}  # eval and heldout each
# Position has 264 prompt groups, the other skills 12-36: capping its share of train keeps RL
# training from being 90% position prompts. Its remaining groups stay unused.
TRAIN_CAP_PER_SKILL = {"position": 48}
SPLIT_SEED = 20240601


@dataclass(frozen=True)
class PromptRecord:
    id: str
    text: str
    skill: str | None = None


def _prompt_dir() -> Path:
    return Path(str(resources.files("solbench.world") / "prompts"))


def build_shapes_splits(seed: int = SPLIT_SEED) -> dict[str, list[PromptRecord]]:
    """The shapes splits, computed from the grammar (the shipped files are this function's output)."""
    from solbench.world.grammar import SKILLS, caption, enumerate_requirements

    rng = np.random.default_rng(seed)
    out: dict[str, list[PromptRecord]] = {s: [] for s in SPLITS}
    for skill in SKILLS:
        groups: dict[tuple, list] = {}
        for req in enumerate_requirements(skill):
            groups.setdefault(req.canonical_key(), []).append(req)
        keys = list(groups)
        order = rng.permutation(len(keys))
        n = EVAL_PER_SKILL[skill]
        for rank, idx in enumerate(order):
            split = "eval" if rank < n else "heldout" if rank < 2 * n else "train"
            if split == "train" and rank - 2 * n >= TRAIN_CAP_PER_SKILL.get(skill, len(keys)):
                continue
            forms = groups[keys[idx]]  # one wording per group, drawn at random
            out[split].append(PromptRecord("", caption(forms[int(rng.integers(len(forms)))]), skill))
    for split, records in out.items():
        out[split] = [PromptRecord(f"{split}-{i:04d}", r.text, r.skill) for i, r in enumerate(records)]
    return out


def write_shapes_splits(folder: Path | None = None) -> None:
    """Regenerate the shipped JSONL files (run after changing the grammar; bump SPLIT_VERSION)."""
    folder = folder or _prompt_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for split, records in build_shapes_splits().items():
        with open(folder / f"shapes_{split}.jsonl", "w") as fh:
            for r in records:
                fh.write(json.dumps({"id": r.id, "text": r.text, "skill": r.skill, "version": SPLIT_VERSION}) + "\n")


DRAW_PREFIX = "shapes/draw"  # "shapes/draw<SEED>": `grammar_draw(SEED)` as a named prompt set


def grammar_draw(seed: int, per_skill: int = 8) -> list[PromptRecord]:
    """A fresh draw from the whole grammar: `per_skill` prompts per skill (fewer where the skill has
    fewer), none of them equal up to wording to each other or to a prompt of shapes/eval or
    shapes/heldout, the sets every choice of weights and recipe was tuned on.

    Loaded by name as "shapes/draw<seed>". Each skill's prompts are its enumerated prompts in an order
    drawn by a numpy generator seeded by `seed`; ids are "draw<seed>-<index>". docs/embedded-world.md
    names the seed its fidelity numbers use (single_object has 12 prompts, 6 of them in eval/heldout).
    """
    from solbench.world.grammar import SKILLS, caption, enumerate_requirements, parse_prompt

    splits = build_shapes_splits()
    tuned = {parse_prompt(r.text).canonical_key() for split in ("eval", "heldout") for r in splits[split]}
    rng = np.random.default_rng(seed)
    records: list[PromptRecord] = []
    for skill in SKILLS:
        seen, taken = set(tuned), 0
        options = enumerate_requirements(skill)
        for idx in rng.permutation(len(options)):
            key = options[idx].canonical_key()
            if key in seen or taken == per_skill:
                continue
            seen.add(key)
            taken += 1
            records.append(PromptRecord(f"draw{seed}-{len(records):04d}", caption(options[idx]), skill))
    return records


#: Bytes a prompt file may have (the PickScore train split has about 2 MB): read whole, so bounded before.
MAX_PROMPT_FILE_BYTES = 64 * 1024 * 1024


def _read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file, split on \\n, \\r\\n or \\r only (as iterating over an open file does;
    str.splitlines would also split a prompt at U+2028, U+0085, form feeds, ...). At most MAX_PROMPT_FILE_BYTES:
    one line naming the bound past it (read that far only, whatever the file is)."""
    raw = read_at_most(path, MAX_PROMPT_FILE_BYTES)
    if raw is None:
        raise ConfigError(f"{path}: more than {MAX_PROMPT_FILE_BYTES // 2**20} MiB, the bound on a prompt file's size "
                          "(the PickScore train split has about 2 MB)")
    try:
        return decode_text(raw, "utf-8-sig").split("\n")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err}); prompt files must be UTF-8") from None


def _read_jsonl(path: Path) -> list[PromptRecord]:
    records = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            text = obj["text"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError(f"{path}:{lineno}: expected a JSON object with a 'text' field "
                              f"({clip(type(err).__name__ + ': ' + str(err))})") from None
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{path}:{lineno}: 'text' must be a non-empty string, got {clip_repr(text)}")
        skill = obj.get("skill")
        if skill is not None and not isinstance(skill, str):
            raise ConfigError(f"{path}:{lineno}: 'skill' must be a string (or absent), got {clip_repr(skill)}")
        records.append(PromptRecord(str(obj.get("id", f"{path.stem}-{lineno - 1:05d}")), text, skill))
    return records


def _check_unique_ids(path: Path, records: list[PromptRecord]) -> list[PromptRecord]:
    seen: dict[str, int] = {}
    for index, record in enumerate(records):
        if record.id in seen:
            raise ConfigError(f"{path}: prompt id {clip_repr(record.id)} is used by records {seen[record.id] + 1} and "
                              f"{index + 1}; ids must be unique (noise seeds and result rows are keyed on them)")
        seen[record.id] = index
    return records


def load_prompt_set(name_or_path: str | Path) -> list[PromptRecord]:
    """Prompts of a named set ("shapes/train", "shapes/eval", "shapes/heldout", "shapes/draw<SEED>") or of a file."""
    name = str(name_or_path)
    if name.startswith(DRAW_PREFIX) and name[len(DRAW_PREFIX):].isdigit():
        return grammar_draw(int(name[len(DRAW_PREFIX):]))
    if name.startswith("shapes/"):
        split = name.split("/", 1)[1]
        if split not in SPLITS:
            raise ConfigError(f"unknown prompt set {name!r}; known: {', '.join('shapes/' + s for s in SPLITS)} "
                              f"and {DRAW_PREFIX}<SEED> (a fresh draw from the grammar)")
        return _read_jsonl(_prompt_dir() / f"shapes_{split}.jsonl")
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"prompt set {clip_repr(name)} is neither a named set (shapes/train, shapes/eval, shapes/heldout, "
            f"{DRAW_PREFIX}<SEED>) nor a file"
        )
    if path.suffix == ".jsonl":
        return _check_unique_ids(path, _read_jsonl(path))
    if path.suffix == ".txt":
        lines = [ln.strip() for ln in _read_lines(path) if ln.strip()]
        return [PromptRecord(f"{path.stem}-{i:05d}", text) for i, text in enumerate(lines)]
    raise ConfigError(f"prompt file {path} must end in .txt (one prompt per line) or .jsonl")


def outside_grammar(records: list[PromptRecord], source: str | Path) -> str | None:
    """Why a prompt set cannot be scored by the shapes world's rewards (None when it can): the first of its
    prompts that the grammar does not parse (solbench.world.grammar.parse_prompt), by its id, clipped."""
    from solbench.world.grammar import PromptParseError, parse_prompt

    for record in records:
        try:
            parse_prompt(record.text)
        except PromptParseError:
            return (f"{source}: prompt {clip_repr(record.id, 40)} ({clip_repr(record.text, 80)}) is not in the "
                    "shapes grammar ('a <colour> <shape>', '<two|three|four> <colour> <shape>s', 'a <colour> "
                    "<shape> and a <colour> <shape>', 'a <colour> <shape> <left of|right of|above|below> a <colour> "
                    "<shape>')")
    return None
