"""The Optuna study of a sweep: where it is stored, its sampler and pruner, and opening it.

The study lives in ``results/<experiment>/sweep/`` (SQLite ``optuna.db`` or an Optuna journal file
``optuna.journal``: the storage Optuna recommends on a shared file system, for Slurm), named ``sweep.study``
(default: the spec name), or in the database at ``sweep.storage_url`` where a cluster has one. ``open_study`` refuses a study
created with another search space or objective (recorded in the study's ``solbench_sweep`` attribute),
unless every trial it holds was rejected by the spec before any run started: such a study (left by a spec
that was then corrected) is started anew, since it holds no result.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from solbench.errors import ConfigError, SolbenchError
from solbench.sweep.objective import Objective
from solbench.sweep.space import SearchSpace, search_space

SWEEP_DIR = "sweep"
STORAGE_FILES = {"sqlite": "optuna.db", "journal": "optuna.journal"}
STUDY_ATTR = "solbench_sweep"  # study user attribute: the search space and objective it was created with


def sweep_dir(spec, results_root: str | Path) -> Path:
    return Path(results_root) / spec.name / SWEEP_DIR


def storage_path(spec, results_root: str | Path) -> Path:
    return sweep_dir(spec, results_root) / STORAGE_FILES[spec.sweep.storage]


def study_name(spec) -> str:
    return spec.sweep.study or spec.name


def _storage(path: Path, url: str | None = None):
    if url:
        return url
    if path.suffix == ".db":
        return f"sqlite:///{path.resolve()}"
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def _grid_sampler(grid: dict[str, list[Any]], seed: int):
    """A GridSampler that never calls ``study.stop()`` (which only works inside ``study.optimize``);
    the sweep loop stops asking once every grid point was tried instead."""
    from optuna.samplers import GridSampler

    class AskTellGridSampler(GridSampler):
        def after_trial(self, study, trial, state, values) -> None:
            return None

    return AskTellGridSampler(grid, seed=seed)


def make_sampler(kind: str, space: SearchSpace, seed: int):
    import optuna

    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "grid":
        return _grid_sampler(space.grid(), seed)
    return optuna.samplers.TPESampler(seed=seed)


def make_pruner(model: Any):
    import optuna

    if model.kind == "none":
        return optuna.pruners.NopPruner()
    if model.kind == "hyperband":  # resources are training steps; the budget is learned from the first trials
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.MedianPruner(n_startup_trials=model.n_startup_trials, n_warmup_steps=model.n_warmup_steps)


def open_study(spec, results_root: str | Path, *, create: bool = True, space: SearchSpace | None = None,
               objective: Objective | None = None, notes: list[str] | None = None):
    """The spec's Optuna study in results/<experiment>/sweep/ (created when missing and ``create``).

    A study created with another search space or objective is refused (Optuna cannot mix them):
    name a new ``sweep.study`` instead. With ``create``, one whose every trial was rejected by the spec
    (``invalid``: no run started) is deleted and created again with this definition, saying so in ``notes``.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = storage_path(spec, results_root)
    name = study_name(spec)
    if not create and not path.exists():
        raise SolbenchError(f"no sweep study at {path} (run `solbench sweep {spec.path}` first)")
    path.parent.mkdir(parents=True, exist_ok=True)
    storage = _storage(path, spec.sweep.storage_url)
    space = space or search_space(spec)
    objective = objective or Objective.from_model(spec.sweep.objective, f"{spec.path}: sweep.objective")
    try:
        if create:
            study = optuna.create_study(storage=storage, study_name=name, directions=objective.directions,
                                        load_if_exists=True, pruner=make_pruner(spec.sweep.pruner))
        else:
            study = optuna.load_study(study_name=name, storage=storage, pruner=make_pruner(spec.sweep.pruner))
    except KeyError:
        raise SolbenchError(f"{path} holds no study {name!r}") from None
    except Exception as err:  # noqa: BLE001 - optuna raises storage-specific errors
        if isinstance(err, SolbenchError):
            raise
        raise SolbenchError(f"{path}: cannot open the Optuna study {name!r}: {type(err).__name__}: {err}") from err
    wanted = {"objective": objective.to_dict(), "params": space.describe()}
    recorded = study.user_attrs.get(STUDY_ATTR)
    if recorded is None:
        if create:
            study.set_user_attr(STUDY_ATTR, wanted)
    else:
        changed = [part for part in ("objective", "params") if recorded.get(part) != wanted[part]]
        trials = study.get_trials(deepcopy=False)
        if changed and create and all(t.user_attrs.get("invalid") for t in trials):
            optuna.delete_study(study_name=name, storage=storage)
            if notes is not None:
                notes.append(f"study {name!r} in {path} held only {len(trials)} trial(s) the spec rejected, under "
                             f"another sweep.{changed[0]}: started anew with this spec's")
            return open_study(spec, results_root, space=space, objective=objective, notes=notes)
        if changed:
            raise ConfigError(
                f"{spec.path}: sweep.{changed[0]} differs from the one study {name!r} in {path} was created with "
                f"({json.dumps(recorded.get(changed[0]), sort_keys=True)} there, "
                f"{json.dumps(wanted[changed[0]], sort_keys=True)} now); Optuna cannot mix them in one study: "
                "set sweep.study to a new name (or remove the study file)")
    return study
