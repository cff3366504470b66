"""The checkpoint `solbench fidelity --checkpoint` measures: ``load_checkpoint`` reads a run's latest checkpoint
(the one a resume would start from) or a named checkpoint file, with the RunConfig it was trained with, and says
which step that is and whether the run is finished (``Checkpoint.notes``, printed by solbench.fidelity.run).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solbench.config import RunConfig
from solbench.errors import ConfigError


@dataclass
class Checkpoint:
    """A run's saved state and the RunConfig it was trained with."""

    config: RunConfig
    step: int
    state: dict
    path: Path
    run_id: str | None
    notes: list[str] = field(default_factory=list)  # what is measured, said on screen: the step, an unfinished run


def load_checkpoint(path: str | Path) -> Checkpoint:
    """The latest checkpoint of a run folder, or one checkpoint file inside a run folder.

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
        store = RunStore(run_dir, run_dir.name)
        files = store.checkpoint_files()
        latest = store.latest_checkpoint() if files else None
        if latest is None:
            raise ConfigError(f"--checkpoint {path}: the run has no readable checkpoint in {run_dir / 'checkpoints'}")
        step, state = latest
        ckpt_path = dict(files).get(step, files[-1][1])  # the file of the step it holds
        skipped = [file for file_step, file in files if file_step > step]
    elif path.is_file():
        run_dir = next((d for d in (path.parent, path.parent.parent) if (d / "spec.json").is_file()), None)
        if run_dir is None:
            raise ConfigError(f"--checkpoint {path}: no spec.json beside it or in its run folder, so its model and "
                              "LoRA settings are unknown")
        ckpt_path, skipped = path, []
        try:
            payload = torch.load(ckpt_path, map_location="cpu", weights_only=False)
            step, state = int(payload["step"]), payload["state"]
        except Exception as err:  # noqa: BLE001 - report any unreadable file the same way
            raise ConfigError(f"--checkpoint {path}: cannot read {ckpt_path} as a solbench checkpoint ({err})") \
                from err
    else:
        raise ConfigError(f"--checkpoint {path}: no such run folder or file")
    if "nets" not in state:
        raise ConfigError(f"--checkpoint {path}: the checkpoint holds no network weights ('nets')")
    config = RunConfig.from_dict(json.loads((run_dir / "spec.json").read_text()))
    notes = _checkpoint_notes(path, run_dir, step, config.iterations, skipped)
    return Checkpoint(config, step, state, ckpt_path, state.get("run_id") or run_dir.name, notes)


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
