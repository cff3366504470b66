"""The checkpoint `solbench fidelity --checkpoint` measures: ``load_checkpoint`` reads a run's latest checkpoint
(the one a resume would start from) or a named checkpoint file, with the RunConfig it was trained with, and says
which step that is and whether the run is finished (``Checkpoint.notes``, printed by solbench.fidelity.experiment.run).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from solbench.text.bounded_text import clip, clip_repr, read_at_most
from solbench.config import RunConfig
from solbench.errors import ConfigError
from solbench.results.checkpoint import UnreadableCheckpoint, missing_keys, read_checkpoint


@dataclass
class Checkpoint:
    """A run's saved state and the RunConfig it was trained with."""

    config: RunConfig
    step: int
    state: dict
    path: Path
    run_id: str | None
    notes: list[str] = field(default_factory=list)  # what is measured, said on screen: the step, an unfinished run


def load_checkpoint(path: str | Path, *, given: Collection[str] = ()) -> Checkpoint:
    """The latest checkpoint of a run folder, or one checkpoint file inside a run folder.

    The files the run's spec.json names and fidelity reads (``FILE_KEYS``: its eval prompts, its weights) must
    lie inside the results folder the run is in or inside the project (the working directory its relative paths
    are read from), symlinks resolved: a results folder from someone else reads nothing outside them
    (``_outside``). ``given``: the keys the caller sets itself (``--prompts`` sets ``eval.prompts``,
    ``--model-path`` ``model.path``), whose stored values are not read.

    The run's spec.json (the folder itself, or the grandparent of ``checkpoints/step_N.pt``) gives the
    model, fine-tuning (LoRA rank, targets) and quantization settings the weights belong to. A run folder's
    latest checkpoint is the one a resume would take (``RunStore.latest_checkpoint``: an unreadable last
    one falls back to the previous). ``notes`` say which step is measured, of how many, and whether the
    run is finished or that fallback was taken.
    """
    from solbench.results import RunStore

    path = Path(path)
    if path.is_dir():
        run_dir = path
        if not (run_dir / "spec.json").is_file():
            raise ConfigError(f"--checkpoint {path}: not a run folder (no spec.json); give results/<experiment>/<run_id> "
                              "or a checkpoint file inside one")
    elif path.is_file():
        run_dir = next((d for d in (path.parent, path.parent.parent) if (d / "spec.json").is_file()), None)
        if run_dir is None:
            raise ConfigError(f"--checkpoint {path}: no spec.json beside it or in its run folder, so its model and "
                              "LoRA settings are unknown")
    else:
        raise ConfigError(f"--checkpoint {path}: no such run folder or file")
    config = _run_config(path, run_dir)
    refused = _outside(config, run_dir, given)  # before anything else of the folder is read
    if refused:
        raise ConfigError(f"--checkpoint {path}: {run_dir / 'spec.json'} names {refused}")
    if path.is_dir():
        store = RunStore(run_dir, run_dir.name)
        files = store.checkpoint_files()
        latest = store.latest_checkpoint(_lacking) if files else None
        if latest is None:
            why = ""
            if files:  # every file refused: say why the newest was (the log said it of each)
                try:
                    read_checkpoint(files[-1][1], _lacking)
                except UnreadableCheckpoint as err:
                    why = f" (the newest: {clip(err, 300)})"
            raise ConfigError(f"--checkpoint {path}: the run has no readable checkpoint in {run_dir / 'checkpoints'}"
                              f"{why}")
        step, state = latest
        ckpt_path = dict(files).get(step, files[-1][1])  # the file of the step it holds
        skipped = [file for file_step, file in files if file_step > step]
    else:
        ckpt_path, skipped = path, []
        try:
            step, state = read_checkpoint(ckpt_path, _lacking)
        except UnreadableCheckpoint as err:
            raise ConfigError(f"--checkpoint {path}: cannot read {ckpt_path} as a solbench checkpoint "
                              f"({clip(err.why)})") from None
    notes = _checkpoint_notes(path, run_dir, step, config.iterations, skipped)
    return Checkpoint(config, step, state, ckpt_path, state.get("run_id") or run_dir.name, notes)


#: The settings of a stored spec.json that name files fidelity reads, and the option that names one instead.
FILE_KEYS = {"eval.prompts": "--prompts", "model.path": "--model-path", "model.checkpoint": None}


def _outside(config: RunConfig, run_dir: Path, given: Collection[str]) -> str | None:
    """The first file setting of ``config`` (FILE_KEYS, less ``given``) that resolves outside both the results
    folder (``run_dir``'s grandparent: results/<experiment>/<run_id>) and the project (the working directory),
    as ``key 'value' ... refused``; None when every one is inside. Nothing of the file is read."""
    from solbench.spec import is_prompt_path

    project = Path.cwd().resolve()
    results = run_dir.resolve().parent.parent
    roots = [project] + ([results] if results != Path(results.anchor) else [])
    for key, option in FILE_KEYS.items():
        section, name = key.split(".")
        value = getattr(getattr(config, section), name)
        if key in given or not isinstance(value, str) or value in ("pretrained", "random"):
            continue
        if key == "eval.prompts" and not is_prompt_path(value):
            continue  # a named set (shapes/eval), no file
        resolved = (project / Path(value).expanduser()).resolve()  # a relative path is read from the project
        if any(resolved.is_relative_to(root) for root in roots):
            continue
        instead = f"; give {option} to name one yourself" if option else ""
        return (f"{key} {clip_repr(value)}, which is {clip(resolved)}: outside both the results folder {results} "
                f"and the project {project}, so it is not read (a results folder reads nothing outside them){instead}")
    return None


#: What fidelity reads from a checkpoint's state (PolicyNets.load_state_dict): a file lacking any is unreadable.
FIDELITY_KEYS = {"nets": {"mode": None, "ema_updates": None, "trainable": None}}


def _lacking(state: dict) -> str | None:
    problem = missing_keys(state, FIDELITY_KEYS)
    return f"{problem} (it holds no network weights fidelity can measure)" if problem else None


#: Bytes of a run's spec.json (a few KB): a larger one is not read.
MAX_SPEC_JSON_BYTES = 16 * 2**20


def _run_config(path: Path, run_dir: Path) -> RunConfig:
    """The RunConfig of the run folder's spec.json; ConfigError naming the file where it is not one."""
    spec_file = run_dir / "spec.json"
    try:
        raw = read_at_most(spec_file, MAX_SPEC_JSON_BYTES)
        if raw is None:
            raise ValueError(f"more than {MAX_SPEC_JSON_BYTES // 2**20} MiB, the bound on a run's spec.json")
        return RunConfig.from_dict(json.loads(raw))
    except (OSError, ValueError, TypeError) as err:
        why = clip(f"{type(err).__name__}: {err}")
        raise ConfigError(f"--checkpoint {path}: {spec_file} is not a run's spec ({why}); "
                          f"`solbench run SPEC --force --only {run_dir.name}` reruns the run") from None


def _checkpoint_notes(path: Path, run_dir: Path, step: int, iterations: int, skipped: list[Path]) -> list[str]:
    """The lines `solbench fidelity` prints about the checkpoint it measures."""
    from solbench.results import RunStore

    notes = []
    if skipped:
        notes.append(f"note: --checkpoint {path}: {', '.join(str(f) for f in skipped)} cannot be read (cut short?); "
                     f"measuring the previous checkpoint, step {step}, as a resume of the run would start from it")
    state = RunStore(run_dir, run_dir.name).read_status().get("state") or "new"
    if state == "done" and step >= iterations:
        notes.append(f"checkpoint: step {step} of {iterations}, the run's final policy")
    elif state == "done":
        notes.append(f"note: --checkpoint {path}: measuring step {step} of {iterations}, not the run's final policy")
    else:
        notes.append(f"note: --checkpoint {path}: the run is not finished (status {state}): measuring step {step} "
                     f"of {iterations}, not its final policy")
    return notes
