"""The sweep loop: ``Sweep`` asks the study for trials, runs each trial's cell (its R seed runs) and tells the
study the outcome.

A trial is one cell: the sampled values trained with ``sweep.seeds_per_cell`` run seeds (solbench/report/sweep_cell.py),
each an ordinary run. Dispatch goes through solbench.launch: with a local profile of one worker the runs execute in
this process, one after another; with more local workers (``workers: auto``: one per core) they run side by side in
worker processes fed from one queue (solbench/sweep/pool.py), up to ``sweep.parallel`` cells in flight; with a Slurm
profile the runs of up to ``parallel`` cells go out as submitit job arrays (``launch_slurm``). While the runs train,
the sweep reads the evaluation rows of their metrics.jsonl and reports, at every training step all of a cell's seeds
have evaluated, the MEAN of their values as the trial's intermediate value, so Optuna pruners (median, hyperband)
decide on the cell, never on one seed; a pruned cell's runs are stopped (in process at the evaluation that decided
it, a worker ended, a Slurm job cancelled); each reads ``failed`` with ``pruned: true`` and keeps its checkpoints,
so the same cell, proposed again, resumes rather than restarts.

A sweep killed mid-cell (kill -9) and started again takes the RUNNING trial up again: its cell is the one its
sampled values give (the run ids are recorded in its ``run_ids`` attribute), the seeds that finished are reused, the
ones cut off resume from their checkpoints and the ones not started run; the grid sampler keeps the seed it was
created with, so the next trials ask the cells not yet tried and every cell of the grid is covered once.

The package docstring (solbench/sweep/__init__.py) describes a sweep as a whole. This module is one class and its
entry point: ``Sweep`` is the ask / launch / observe / prune / tell loop, and its methods share one sweep's state
(the study, the cells in flight, the session lock). The parts with a job of their own are their own modules: the
search space (space), the study and its storage (study), a cell in flight (flight), a cell's numbers (cell), the
objective read from a run's curve (objective, curve), the Pareto front (pareto), the local workers (pool), Slurm
job ids and cancelling (slurm) and the trials table (trials).

One module of about 560 lines, on purpose: the loop, placing cells, polling, pruning and finishing all act on one
study and its cells in flight (``Sweep``'s state); the cell and flight records are flight.py, the worker pool
pool.py, the Slurm arrays slurm.py, the study and trials table study.py / trials.py. The seam left is reading and
judging the intermediate values (``_observe``, ``_report``, ``_prune``).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.config import RunConfig
from solbench.errors import ConfigError, SolbenchError
from solbench.launch import (DEFAULT_RUN_FN, LOCK_FILE, RunTask, execute_run, launch_slurm, prepare_run, preflight,
                             run_fn_ref, run_lock, run_states)
from solbench.report.sweep_cell import (CLOCK, cell_interval, cell_seeds, check_seed_axis, mean_curve,
                                        measured_iteration_seconds)
from solbench.report.sweep_curve import ObjectiveError
from solbench.sweep.flight import _Cell, _Flight, _StopRun
from solbench.sweep.objective import Objective
from solbench.sweep.slurm import _job_id, _scancel
from solbench.sweep.space import search_space
from solbench.sweep.study import make_sampler, open_study, storage_path, study_name, sweep_dir
from solbench.sweep.trials import TRIALS_FILE, counted, export_trials

log = logging.getLogger(__name__)

SESSION_DIR = ".session"  # holds the lock of the one sweep process working on the study
MAX_RELAUNCHES = 2  # an interrupted run (job cancelled or killed outside the sweep) is relaunched this often
MAX_CONSECUTIVE_INVALID = 50  # asks in a row that the spec rejects before the search space is called unusable


@dataclass
class SweepResult:
    """What a ``Sweep.run`` did and where the study is."""

    study: Any  # optuna.Study
    storage: Path | str
    trials_path: Path
    target: int
    finished_now: list[int] = field(default_factory=list)  # trial numbers finished by this invocation
    notes: list[str] = field(default_factory=list)

    @property
    def best(self):
        """The best COMPLETE trial, or None."""
        complete = [t for t in self.study.trials if t.state.name == "COMPLETE" and t.values]
        if not complete or len(self.study.directions) > 1:
            return None
        return self.study.best_trial


class Sweep:
    """An Optuna study over a spec's axes whose trials are cells of R seed runs (see the module docstring).

    ``run_fn`` executes one run (default: the trainer; tests pass a module-level function), and
    ``sys_path`` entries are prepended inside Slurm jobs and local workers so they can import it. ``echo`` receives
    one line per trial event. ``workers`` overrides the local profile's (1: every run in this process).
    """

    def __init__(self, spec, results_root: str | Path = "results", *, profile_name: str | None = None,
                 run_fn: str | Callable = DEFAULT_RUN_FN, sys_path: Sequence[str] = (), poll_s: float = 5.0,
                 echo: Callable[[str], None] | None = None, workers: int | None = None):
        from solbench.launch.local import local_workers
        from solbench.spec import load_profile

        if spec.sweep is None:
            raise ConfigError(f"{spec.path}: no sweep: block to run (see experiments/README.md, 'Sweeps')")
        self.spec = spec
        self.results_root = Path(results_root)
        self.space = search_space(spec)
        self.seeds_per_cell = spec.sweep.seeds_per_cell
        check_seed_axis(self.space.names, self.seeds_per_cell, self.space.where("sweep", "seeds_per_cell")
                        if self.space.where else f"{spec.path}: sweep.seeds_per_cell")
        self.objective = Objective.from_model(spec.sweep.objective, f"{spec.path}: sweep.objective")
        self.profile_path, self.profile = load_profile(profile_name or spec.launch, spec.path)
        # the objective against the runs before any study exists: a study keeps the objective it was created
        # with, so an error found at the first trial would refuse the corrected spec as another objective
        for config in self.space.resolved_corners(spec):
            self._check_objective_metric(config)
        self.run_fn = run_fn_ref(run_fn)
        self.sys_path = list(sys_path)
        self.poll_s = poll_s
        self.echo = echo or (lambda line: None)
        self.dir = sweep_dir(spec, self.results_root)
        self.notes = list(self.space.notes)
        self.parallel = spec.sweep.parallel
        self.workers = 1
        self.pool = None
        if self.profile.executor == "local":
            corners = list(self.space.resolved_corners(spec))[:1]
            runs = [_Planned(c) for c in corners] * (self.parallel * self.seeds_per_cell)
            self.workers = workers if workers is not None else local_workers(getattr(self.profile, "workers", 1), runs)
            if self.workers == 1 and self.parallel > 1:
                self.notes.append(f"profile {self.profile_path} runs in this process: cells run one at a time "
                                  f"(sweep.parallel={self.parallel} applies with local workers and on Slurm)")
                self.parallel = 1
        self.study = None
        self._cells: dict[tuple[str, ...], _Cell] = {}
        self._stopping: dict[str, _Flight] = {}  # pruned runs whose worker or job is being stopped
        self._finished_now: list[int] = []

    # -- entry point --------------------------------------------------------------------------

    def run(self, trials: int | None = None) -> SweepResult:
        """Run (or continue) the study until it holds ``trials`` counted trials (default: the spec's)."""
        target = int(trials if trials is not None else self.spec.sweep.trials)
        if target < 0:
            raise ConfigError(f"--trials must be >= 0, got {target}")
        self.dir.mkdir(parents=True, exist_ok=True)
        with run_lock(self.dir / SESSION_DIR, wait_s=0) as acquired:
            if not acquired:
                holder = (self.dir / SESSION_DIR / LOCK_FILE).read_text().strip()
                raise SolbenchError(f"another `solbench sweep` runs study {study_name(self.spec)!r} of "
                                    f"{self.spec.name} (host pid: {holder}); wait for it or stop it first")
            self.study = open_study(self.spec, self.results_root, space=self.space, objective=self.objective,
                                    notes=self.notes)
            # grid: the seed the study was created with, always (GridSampler numbers the first trials' grid points
            # through its seeded permutation of the grid: another seed after a resume would give trial 1 the cell
            # trial 0 had). Random and TPE: a seed moved on by the trials held, so a resume asks new points.
            offset = 0 if self.spec.sweep.sampler == "grid" else len(self.study.trials)
            self.study.sampler = make_sampler(self.spec.sweep.sampler, self.space, self.spec.sweep.sampler_seed + offset)
            if self.workers > 1:
                from solbench.sweep.pool import SweepPool

                self.pool = SweepPool(self.workers)
            try:
                self._adopt_orphans()
                self._loop(target)
                self._wait_for_stopping(timeout_s=max(30.0, 6 * self.poll_s))
            finally:
                if self.pool is not None:
                    self.pool.close()
                self.export()
        return SweepResult(self.study, storage_path(self.spec, self.results_root), self.dir / TRIALS_FILE, target,
                           self._finished_now, self.notes)

    def export(self) -> Path | None:
        if self.study is None:
            return None
        return export_trials(self.study, self.dir / TRIALS_FILE, self.space.names)

    # -- the loop -----------------------------------------------------------------------------

    def _in_flight(self) -> int:
        return sum(len(c.trials) for c in self._cells.values())

    def _flights(self) -> list[_Flight]:
        return [f for c in self._cells.values() for f in c.flights]

    def _wanted(self, target: int) -> bool:
        """Whether another trial should be asked: the study is short of ``target`` and the grid is not used up."""
        done = sum(1 for t in self.study.get_trials(deepcopy=False) if counted(t))
        return done + self._in_flight() < target and not self._grid_used_up()

    def _loop(self, target: int) -> None:
        invalid_in_row = 0
        while True:
            while self._in_flight() < self.parallel and self._wanted(target):
                _, invalid = self._new_trial()
                if invalid:
                    invalid_in_row += 1
                    if invalid_in_row >= MAX_CONSECUTIVE_INVALID:
                        raise ConfigError(f"{self.spec.path}: sweep: the last {invalid_in_row} sampled combinations "
                                          f"were all rejected (last: {invalid}); narrow sweep.params")
                    continue
                invalid_in_row = 0
            launches = [f for f in self._flights() if not f.launched and not f.ended]
            if launches:
                self._launch(launches)  # in this process: runs them here and now
            if not self._cells:
                if not self._wanted(target):
                    return
                continue  # cells ended (or were pruned) during the launch: ask for more
            self._poll()
            if self._cells:
                if self.pool is not None:
                    self.pool.pump(timeout=self.poll_s)
                elif self.profile.executor != "local" or not launches:
                    time.sleep(self.poll_s)  # Slurm jobs, or runs executed by another process

    def _grid_used_up(self) -> bool:
        if self.spec.sweep.sampler != "grid":
            return False
        size = math.prod(len(values) for values in self.space.grid().values())
        started = {t.system_attrs["grid_id"] for t in self.study.get_trials(deepcopy=False)
                   if "grid_id" in t.system_attrs and (t.state.is_finished() or t.state.name == "RUNNING")}
        if len(started) >= size:
            note = f"all {size} combinations of the grid were tried"
            if note not in self.notes:
                self.notes.append(note)
            return True
        return False

    def _cell_configs(self, assignment: Mapping[str, Any]) -> list[RunConfig]:
        """The RunConfigs of a cell's seed runs; ConfigError for a combination the spec rejects."""
        entry = self.space.excluded_by(assignment)
        if entry is not None:
            raise ConfigError(f"excluded by the spec's exclude entry {entry}")
        configs = []
        for seed in cell_seeds(assignment, self.seeds_per_cell):
            run = self.spec.resolve({**assignment, "seed": seed}, ("sweep", "params"))
            self._check_objective_metric(run.config)
            configs.append(run.config)
        return configs

    def _new_trial(self) -> tuple[_Cell | None, str | None]:
        """Ask a trial and attach it to its cell; (cell or None when finished at once, invalid reason)."""
        trial = self.study.ask(self.space.distributions)
        label = _label(trial.params)
        try:
            configs = self._cell_configs(self.space.assignment(trial.params))
        except ConfigError as err:
            trial.set_user_attr("invalid", True)
            if isinstance(err, _MetricMismatch):  # a spec error: stop the sweep
                self._tell(trial, "FAIL", reason=str(err))
                raise
            self._tell(trial, "FAIL", reason=f"invalid combination: {err}")
            self.echo(f"trial {trial.number}: {label}: skipped, the spec rejects it ({err})")
            return None, str(err)
        _record_runs(trial, configs)
        key = tuple(c.run_id for c in configs)
        cell = self._cells.get(key)
        if cell is not None:  # the same cell is already training for another trial
            cell.add_trial(trial)
            self.echo(f"trial {trial.number}: {label}: its runs are already training for trial {cell.trials[0].number}")
            return cell, None
        cell = _Cell([_Flight(c, self.spec.run_dir(self.results_root, c.run_id)) for c in configs], [trial], label)
        return self._place(cell), None

    def _check_objective_metric(self, config: RunConfig) -> None:
        problem = self.objective.metric_problem(config)
        if problem:
            where = self.space.where("sweep", "objective", "metric") if self.space.where else \
                f"{self.spec.path}: sweep.objective.metric"
            raise _MetricMismatch(f"{where}: {problem}")

    def _place(self, cell: _Cell) -> _Cell | None:
        """Decide what a new or adopted cell needs: reuse its done runs, watch its live ones, launch the rest."""
        states = run_states({f.run_id: f.run_dir for f in cell.flights})
        seeds = ", ".join(str(f.seed) for f in cell.flights)
        if all(states[f.run_id][0] == "done" for f in cell.flights):
            for flight in cell.flights:
                flight.ended = "done"
            self.echo(f"trial {cell.numbers}: {cell.label}: its runs (seeds {seeds}) are done: reused")
            self._finish(cell)
            return None
        self._cells[cell.key] = cell
        parts = []
        for flight in cell.flights:
            state = states[flight.run_id][0]
            if state == "done":
                flight.ended = "done"
                parts.append(f"seed {flight.seed} done")
            elif state in ("pending", "running"):
                flight.launched = True
                flight.job_id = _job_id(flight.run_dir)
                parts.append(f"seed {flight.seed} {state} already (watched)")
        self.echo(f"trial {cell.numbers}: {cell.label}: seeds {seeds}" + (f" ({'; '.join(parts)})" if parts else ""))
        return cell

    def _adopt_orphans(self) -> None:
        """Trials left RUNNING by an interrupted sweep: their cells taken up again (see the module docstring)."""
        import optuna

        for frozen in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            if set(frozen.params) != set(self.space.names):  # interrupted inside ask, before its values existed
                trial.set_user_attr("invalid", True)
                self._tell(trial, "FAIL", reason="the sweep was interrupted before this trial's values were sampled")
                continue
            try:
                configs = self._cell_configs(self.space.assignment(frozen.params))
            except ConfigError as err:
                trial.set_user_attr("invalid", True)
                self._tell(trial, "FAIL", reason=f"invalid combination: {err}")
                continue
            recorded = frozen.user_attrs.get("run_ids")
            if recorded and list(recorded) != [c.run_id for c in configs]:
                self._tell(trial, "FAIL", reason="the spec changed since this trial started (its runs' ids differ)")
                continue
            _record_runs(trial, configs)
            key = tuple(c.run_id for c in configs)
            if key in self._cells:
                self._cells[key].add_trial(trial, set(frozen.intermediate_values))
                continue
            cell = _Cell([_Flight(c, self.spec.run_dir(self.results_root, c.run_id)) for c in configs], [trial],
                         _label(frozen.params), {frozen.number: set(frozen.intermediate_values)})
            self.echo(f"trial {frozen.number}: taken up again from the interrupted sweep")
            self._place(cell)

    # -- launching ----------------------------------------------------------------------------

    def _launch(self, flights: list[_Flight]) -> None:
        from solbench.spec import PlannedRun

        runs = [PlannedRun(f.config, {}) for f in flights]
        preflight(self.spec, runs)
        if self.profile.executor == "local":
            for flight in flights:
                if flight.cell.stopping:
                    continue  # its cell was pruned while an earlier seed trained
                if self.pool is not None:
                    store = prepare_run(PlannedRun(flight.config, {}), flight.run_dir, force=False)
                    flight.launched = True
                    self.pool.submit(RunTask(str(store.run_dir), flight.config.to_dict(), self.run_fn, self.sys_path))
                else:
                    self._execute_here(flight)
            return
        submission = launch_slurm(self.spec, runs, self.results_root, self.profile, run_fn=self.run_fn,
                                  sys_path=self.sys_path)
        for flight in flights:
            flight.launched = True
            flight.job_id = submission.job_ids.get(flight.run_id)
        for cell in {id(f.cell): f.cell for f in flights}.values():
            for trial in cell.trials:
                trial.set_user_attr("job_ids", [f.job_id for f in cell.flights])
        self.echo(f"submitted {len(flights)} run(s) of {len({id(f.cell) for f in flights})} cell(s) to Slurm: "
                  f"{', '.join(f'{f.run_id} (job {f.job_id})' for f in flights)}")

    def _execute_here(self, flight: _Flight) -> None:
        from solbench.spec import PlannedRun

        store = prepare_run(PlannedRun(flight.config, {}), flight.run_dir, force=False)
        flight.launched = True
        task = RunTask(str(store.run_dir), flight.config.to_dict(), self.run_fn, self.sys_path)

        def listener(run_id: str, step: int, phase: str, info: dict) -> None:
            if self._observe(flight.cell):
                raise _StopRun(step)

        try:
            execute_run(task, progress=listener)
        except _StopRun:
            _record_pruned_run(flight, self.spec)

    # -- watching -----------------------------------------------------------------------------

    def _observe(self, cell: _Cell) -> bool:
        """Report the seed-mean curve's new steps to the cell's trials; True when the cell should be pruned."""
        if self.objective.multi or cell.stopping:  # Optuna prunes single-objective studies only
            return False
        changed = False
        for flight in cell.flights:
            path = flight.store.table_path("metrics")
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                continue
            if size != flight.metrics_size:
                flight.metrics_size = size
                flight.curve = self.objective.curve(flight.store.read("metrics"))
                changed = True
        if not changed:
            return False
        curve = mean_curve([f.curve for f in cell.flights])
        new = self._report(cell, curve)
        if not new or not curve or curve[-1].step >= cell.flights[0].config.iterations:
            return False  # nothing new, or the final evaluation: nothing left to save by stopping
        if cell.trials[0].should_prune():
            cell.pruned_at = curve[-1].step
            self._prune(cell)
            return True
        return False

    def _report(self, cell: _Cell, curve) -> bool:
        new = False
        for trial in cell.trials:
            seen = cell.reported.setdefault(trial.number, set())
            for point in curve:
                if point.step not in seen:
                    trial.report(self.objective.intermediate(point), point.step)
                    seen.add(point.step)
                    new = True
        return new

    def _prune(self, cell: _Cell) -> None:
        """Tell the study the cell's trials are pruned and stop its runs that have not ended."""
        cell.stopping = True
        self._cells.pop(cell.key, None)
        for trial in cell.trials:
            self._tell(trial, "PRUNED", reason=f"pruned at step {cell.pruned_at}" + (
                f" (mean of {len(cell.flights)} seeds)" if len(cell.flights) > 1 else ""))
        self.echo(f"trial {cell.numbers}: {cell.label}: pruned at step {cell.pruned_at} on the mean of its "
                  f"{len(cell.flights)} seeds")
        for flight in cell.flights:
            if flight.ended or not flight.launched:
                continue
            if self.profile.executor != "local":
                job = flight.job_id or _job_id(flight.run_dir)
                if job:
                    _scancel(job)
                self._stopping[flight.run_id] = flight
            elif self.pool is not None:
                if self.pool.stop(flight.run_id):
                    self._stopping[flight.run_id] = flight
                else:  # still queued: it never started
                    _record_pruned_run(flight, self.spec)
            # in this process: the listener raises _StopRun in the run that is training

    def _poll(self) -> None:
        for cell in list(self._cells.values()):
            self._observe(cell)
        self._check_stopping()
        flights = {f.run_id: f for f in self._flights() if not f.ended and f.launched}
        if not flights:
            self._finish_ended()
            return
        states = run_states({run_id: f.run_dir for run_id, f in flights.items()})
        for run_id, (state, status) in states.items():
            flight = flights[run_id]
            if flight.cell.stopping:
                continue
            if state in ("done", "failed"):
                flight.ended, flight.error = state, status.get("error")
            elif state in ("interrupted", "new"):
                if flight.relaunches >= MAX_RELAUNCHES:
                    flight.ended = "failed"
                    flight.error = (f"run {state} after {flight.relaunches + 1} launches (job cancelled or killed "
                                    "outside the sweep)")
                    continue
                flight.relaunches += 1
                self.echo(f"run {run_id} (seed {flight.seed}) was {state}: launching it again (resumes from its "
                          "checkpoint)")
                flight.launched = False
        self._finish_ended()

    def _finish_ended(self) -> None:
        for cell in list(self._cells.values()):
            if cell.ended:
                self._cells.pop(cell.key)
                self._finish(cell)

    def _check_stopping(self) -> None:
        """Record pruned runs as pruned once their worker or cancelled job is gone (one that finished before the
        stop landed stays done)."""
        if not self._stopping:
            return
        states = run_states({run_id: flight.run_dir for run_id, flight in self._stopping.items()})
        for run_id, (state, _) in states.items():
            if state not in ("pending", "running"):
                if state == "interrupted":
                    _record_pruned_run(self._stopping[run_id], self.spec)
                self._stopping.pop(run_id)

    def _wait_for_stopping(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._stopping and time.monotonic() < deadline:
            self._check_stopping()
            if self._stopping:
                time.sleep(min(self.poll_s, 1.0))
        for run_id in self._stopping:
            log.warning("pruned run %s still had a live job when the sweep ended", run_id)

    def _finish(self, cell: _Cell) -> None:
        """Tell the study the outcome of a cell: the mean of its seeds' objectives, or why it has none."""
        rows = [f.store.read("metrics") for f in cell.flights]
        if not self.objective.multi:  # intermediate values of reused runs, so later pruning sees them
            self._report(cell, mean_curve([self.objective.curve(r) for r in rows]))
        failed = [f for f in cell.flights if f.ended != "done"]
        if failed:
            why = "; ".join(f"seed {f.seed}: run {f.run_id} failed: {f.error or 'see its status.json'}" for f in failed)
            for trial in cell.trials:
                self._tell(trial, "FAIL", reason=why)
            self.echo(f"trial {cell.numbers}: {cell.label}: {why}")
            return
        try:
            per_seed = [self.objective.values(r, f.store.read("timings") if self.objective.multi else (), f.config)
                        for f, r in zip(cell.flights, rows)]
        except ObjectiveError as err:
            for trial in cell.trials:
                self._tell(trial, "FAIL", reason=f"cell {cell.label}: {err}")
            self.echo(f"trial {cell.numbers}: no objective: {err}")
            return
        values = [statistics.fmean(v[i] for v in per_seed) for i in range(len(per_seed[0]))]
        seed_values = [v[0] for v in per_seed]
        seconds = [measured_iteration_seconds(r) for r in rows]
        lo, hi, covers = (cell_interval(rows, self.objective.metric, seed_values) if self.objective.direction ==
                          "maximize" else (math.nan, math.nan, "a minimised objective: no reward interval"))
        for trial in cell.trials:
            trial.set_user_attr("seed_values", seed_values)
            trial.set_user_attr("interval", [lo, hi])
            trial.set_user_attr("covers", covers)
            trial.set_user_attr("seed_seconds_per_iter", [s if math.isfinite(s) else None for s in seconds])
            trial.set_user_attr("clock", CLOCK)
            self._tell(trial, "COMPLETE", value=values if self.objective.multi else values[0])
        shown = ", ".join(f"{v:.6g}" for v in values)
        self.echo(f"trial {cell.numbers}: {cell.label}: {shown} (mean of seeds {', '.join(str(f.seed) for f in cell.flights)}: "
                  f"{', '.join(f'{v:.4g}' for v in seed_values)})")

    def _tell(self, trial, state: str, *, value: float | list[float] | None = None, reason: str | None = None) -> None:
        import optuna

        if reason:
            trial.set_user_attr("reason", reason)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.study.tell(trial, value if state == "COMPLETE" else None, state=optuna.trial.TrialState[state],
                            skip_if_finished=True)
        if not trial.user_attrs.get("invalid"):
            self._finished_now.append(trial.number)
        self.export()


@dataclass
class _Planned:
    """What ``local_workers`` reads of a run: its config."""

    config: RunConfig


def _record_runs(trial, configs: Sequence[RunConfig]) -> None:
    trial.set_user_attr("run_ids", [c.run_id for c in configs])
    trial.set_user_attr("run_id", configs[0].run_id)
    trial.set_user_attr("seeds", [int(c.seed) for c in configs])


def _record_pruned_run(flight: _Flight, spec) -> None:
    store = flight.store
    status = store.read_status()
    if status.get("state") == "done":
        return
    store.write_status("failed", pruned=True, error=f"pruned by sweep {study_name(spec)!r} at step "
                                                    f"{flight.cell.pruned_at}", slurm_job_id=status.get("slurm_job_id"))


class _MetricMismatch(ConfigError):
    """The objective's metric is not evaluated by the runs: a spec error, not an invalid combination."""


def _label(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def run_sweep(spec, results_root: str | Path = "results", *, trials: int | None = None, **kwargs: Any) -> SweepResult:
    """Run or continue ``spec``'s sweep (see ``Sweep``); returns the study and what happened."""
    return Sweep(spec, results_root, **kwargs).run(trials)
