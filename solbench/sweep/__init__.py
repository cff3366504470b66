"""Optuna sweeps over a spec's axes: ``solbench sweep SPEC``.

A spec with a ``sweep:`` block (validated by solbench.spec, ``SweepModel``) names the axes to search
and how to score a trial::

    matrix:                       # every axis not swept has exactly one value here
      method: [sol_rl]
      seed: [0]
      explore_steps: [2]
    sweep:
      trials: 6                   # trials (cells) the study should hold (not counting invalid combinations)
      parallel: 2                 # cells in flight at once (local workers or Slurm job arrays)
      seeds_per_cell: 3           # run seeds a cell trains (the matrix's seed and the next ones); default 3
      sampler: tpe                # tpe | random | grid (grid needs choices or stepped ranges)
      storage: sqlite             # results/<experiment>/sweep/optuna.db (journal: optuna.journal; storage_url: a DB)
      objective: {kind: final_reward, metric: shapes_geneval}
      pruner: {kind: median, n_startup_trials: 2}
      params:
        n: {choices: [4, 8]}
        k: {low: 2, high: 4, step: 2}

Each trial is one cell: its sampled values and the matrix's fixed values, trained with ``seeds_per_cell`` run
seeds. Each seed resolves through ``ExperimentSpec.resolve`` into a RunConfig, whose hash is the run id, so every
run lives in ``results/<experiment>/<run_id>/`` like any other and a run that is already done is reused without
training again. The trial's value is the mean of its seeds' values; each seed's value, the cell's interval (run
seeds crossed with eval prompts) and its MEASURED seconds per iteration are kept in its user attributes and in the
trials table, and the pruner is told the seeds' mean (solbench/report/sweep_cell.py). A combination the spec rejects
(K > N, batch arithmetic, an ``exclude`` entry) is recorded as a FAIL trial with ``invalid`` set and does not count
towards ``trials``.

Persistence: the study lives in ``results/<experiment>/sweep/`` (SQLite ``optuna.db`` or an Optuna
journal file ``optuna.journal``; prefer the journal on network filesystems), named ``sweep.study``
(default: the spec name). Running ``solbench sweep`` again continues it: finished trials stay,
trials left running by an interrupted sweep (Ctrl-C, kill -9) are taken up again (their finished seeds reused,
their Slurm jobs watched, their cut-off runs relaunched from their checkpoints), so every cell runs once, and new
trials are asked until the study holds ``trials`` of them. One sweep process per study at a time
(``sweep/.session/.lock``). After every finished trial ``sweep/trials.parquet`` is rewritten (number, state,
value, ``params_<name>``, run_ids, seed_values, ...), which the report reads (solbench/report/sweep_io.py).

One job a module (this __init__ only re-exports their public names; the maths over stored rows it shares with the
report lives below it, in solbench/report/sweep_curve.py (``ObjectiveError`` and the curve metrics, pure functions
of a run's metrics rows) and solbench/report/sweep_cell.py (a cell's seeds, its seed-mean curve, its measured seconds
per iteration and its interval)):

- objective.py: ``Objective``, what a trial scores (the objective kinds are described there);
- pareto.py: the ``reward_and_time`` objective, reward against PROJECTED GPU time per iteration;
- space.py: ``SearchSpace``, the spec's ``sweep.params`` as Optuna distributions;
- study.py: the study's storage, sampler and pruner, ``open_study``;
- trials.py: the trials table (``sweep/trials.parquet``);
- runner.py: ``Sweep`` and ``run_sweep``, the loop that runs trials (flight.py: its record of a cell and its runs
  in flight; pool.py: the local worker processes; slurm.py: cancelling a pruned Slurm job).

Stage ``sweep`` (solbench/stages.py): it imports its own modules and the stages below it, speed, fidelity, measure,
doctor, launch, collect, spec, train, method, engine, rewards, models, quant, world, report, results, machine, text,
base.
"""

from solbench.report.sweep_cell import cell_interval, cell_seeds, mean_curve, measured_iteration_seconds
from solbench.report.sweep_curve import (CurvePoint, ObjectiveError, final_reward, metric_curve, reward_at_budget,
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
    "TRIALS_FILE", "CurvePoint", "Objective", "ObjectiveError", "SearchSpace", "Sweep", "SweepResult", "cell_interval",
    "cell_seeds", "counted", "export_trials", "final_reward", "make_pruner", "make_sampler", "mean_curve",
    "measured_iteration_seconds", "metric_curve", "open_study", "reward_at_budget", "run_sweep", "search_space",
    "storage_path", "study_name", "sweep_dir", "time_to_target", "trials_frame",
]
