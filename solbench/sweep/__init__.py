"""Optuna sweeps over a spec's axes: ``solbench sweep SPEC``.

A spec with a ``sweep:`` block (validated by solbench.spec, ``SweepModel``) names the axes to search
and how to score a trial::

    matrix:                       # every axis not swept has exactly one value here
      method: [sol_rl]
      seed: [0]
      explore_steps: [2]
    sweep:
      trials: 6                   # trials the study should hold (not counting invalid combinations)
      parallel: 2                 # trials in flight at once on Slurm (locally: one after another)
      sampler: tpe                # tpe | random | grid (grid needs choices or stepped ranges)
      storage: sqlite             # results/<experiment>/sweep/optuna.db (journal: optuna.journal)
      objective: {kind: final_reward, metric: shapes_geneval}
      pruner: {kind: median, n_startup_trials: 2}
      params:
        n: {choices: [4, 8]}
        k: {low: 2, high: 4, step: 2}

Each trial is an ordinary run: its sampled values and the matrix's fixed values resolve through
``ExperimentSpec.resolve`` into a RunConfig, whose hash is the run id, so the run lives in
``results/<experiment>/<run_id>/`` like any other and a run that is already done is reused without
training again. A combination the spec rejects (K > N, batch arithmetic, an ``exclude`` entry) is
recorded as a FAIL trial with ``invalid`` set and does not count towards ``trials``.

Persistence: the study lives in ``results/<experiment>/sweep/`` (SQLite ``optuna.db`` or an Optuna
journal file ``optuna.journal``; prefer the journal on network filesystems), named ``sweep.study``
(default: the spec name). Running ``solbench sweep`` again continues it: finished trials stay,
trials left running by an interrupted sweep are taken up again (their Slurm jobs watched, or their
runs relaunched, resuming from checkpoints), and new trials are asked until the study holds
``trials`` of them. One sweep process per study at a time (``sweep/.session/.lock``). After every finished
trial ``sweep/trials.parquet`` is rewritten (number, state, value, ``params_<name>``, run_id, ...),
which the report's N x K heat map reads (solbench/report/sweep_io.py).

One job a module (this __init__ only re-exports their public names):

- curve.py: ``ObjectiveError`` and the curve metrics, pure functions of a run's metrics rows;
- objective.py: ``Objective``, what a trial scores (the objective kinds are described there);
- pareto.py: the ``reward_and_time`` objective, reward against PROJECTED GPU time per iteration;
- space.py: ``SearchSpace``, the spec's ``sweep.params`` as Optuna distributions;
- study.py: the study's storage, sampler and pruner, ``open_study``;
- trials.py: the trials table (``sweep/trials.parquet``);
- runner.py: ``Sweep`` and ``run_sweep``, the loop that runs trials (flight.py: its record of a run in
  flight; slurm.py: cancelling a pruned Slurm job).
"""

from solbench.sweep.curve import (CurvePoint, ObjectiveError, final_reward, metric_curve, reward_at_budget,
                                  time_to_target)
from solbench.sweep.objective import KINDS, Objective
from solbench.sweep.runner import (MAX_CONSECUTIVE_INVALID, MAX_RELAUNCHES, SESSION_DIR, Sweep, SweepResult,
                                   run_sweep)
from solbench.sweep.space import SearchSpace, search_space
from solbench.sweep.study import (STORAGE_FILES, STUDY_ATTR, SWEEP_DIR, make_pruner, make_sampler, open_study,
                                  storage_path, study_name, sweep_dir)
from solbench.sweep.trials import TRIALS_FILE, counted, export_trials, trials_frame

__all__ = [
    "KINDS", "MAX_CONSECUTIVE_INVALID", "MAX_RELAUNCHES", "SESSION_DIR", "STORAGE_FILES", "STUDY_ATTR", "SWEEP_DIR",
    "TRIALS_FILE", "CurvePoint", "Objective", "ObjectiveError", "SearchSpace", "Sweep", "SweepResult", "counted",
    "export_trials", "final_reward", "make_pruner", "make_sampler", "metric_curve", "open_study", "reward_at_budget",
    "run_sweep", "search_space", "storage_path", "study_name", "sweep_dir", "time_to_target", "trials_frame",
]
