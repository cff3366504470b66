"""The sweep loop: ``Sweep`` asks the study for trials, runs them as ordinary runs and tells it the outcome.

Dispatch goes through solbench.launch: with a local profile a trial runs in this process
(``execute_run``), one after another; with a Slurm profile up to ``parallel`` trials run as submitit
jobs (``launch_slurm``). While a run trains, the sweep reads the evaluation rows of its
metrics.jsonl (the objective's metric) and reports them as intermediate values at the training
step, so Optuna pruners (median, hyperband) can stop it: a pruned local run is stopped at the
evaluation that decided it, a pruned Slurm job is cancelled; either way its status.json says
``failed`` with ``pruned: true`` and it keeps its checkpoints, so the same run, proposed again,
resumes rather than restarts.

The package docstring (solbench/sweep/__init__.py) describes a sweep as a whole.

This module is one class and its entry point (about 450 lines for that reason): ``Sweep`` is the ask / launch /
observe / prune / tell loop, and its methods share one sweep's state (the study, the trials in flight, the
relaunch counts, the session lock). The parts with a job of their own are already their own modules: the search
space (space), the study and its storage (study), a trial in flight (flight), the objective read from a run's
curve (objective, curve), the Pareto front (pareto), Slurm job ids and cancelling (slurm) and the trials table (trials).
"""

from __future__ import annotations

import logging
import math
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
from solbench.results import RunStore
from solbench.sweep.curve import ObjectiveError
from solbench.sweep.flight import _Flight, _StopRun
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
    storage: Path
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
    """An Optuna study over a spec's axes whose trials are runs (see the module docstring).

    ``run_fn`` executes one run (default: the trainer; tests pass a module-level function), and
    ``sys_path`` entries are prepended inside Slurm jobs so they can import it. ``echo`` receives one
    line per trial event.
    """

    def __init__(self, spec, results_root: str | Path = "results", *, profile_name: str | None = None,
                 run_fn: str | Callable = DEFAULT_RUN_FN, sys_path: Sequence[str] = (), poll_s: float = 5.0,
                 echo: Callable[[str], None] | None = None):
        from solbench.spec import load_profile

        if spec.sweep is None:
            raise ConfigError(f"{spec.path}: no sweep: block to run (see experiments/README.md, 'Sweeps')")
        self.spec = spec
        self.results_root = Path(results_root)
        self.space = search_space(spec)
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
        if self.profile.executor == "local" and self.parallel > 1:
            self.notes.append(f"profile {self.profile_path} runs in this process: trials run one at a time "
                              f"(sweep.parallel={self.parallel} applies on Slurm)")
            self.parallel = 1
        self.study = None
        self._flights: dict[str, _Flight] = {}  # run_id -> flight
        self._stopping: dict[str, _Flight] = {}
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
            self.study.sampler = make_sampler(self.spec.sweep.sampler, self.space,
                                              self.spec.sweep.sampler_seed + len(self.study.trials))
            try:
                self._adopt_orphans()
                self._loop(target)
                self._wait_for_stopping(timeout_s=max(30.0, 6 * self.poll_s))
            finally:
                self.export()
        return SweepResult(self.study, storage_path(self.spec, self.results_root), self.dir / TRIALS_FILE, target,
                           self._finished_now, self.notes)

    def export(self) -> Path | None:
        if self.study is None:
            return None
        return export_trials(self.study, self.dir / TRIALS_FILE, self.space.names)

    # -- the loop -----------------------------------------------------------------------------

    def _in_flight(self) -> int:
        return sum(len(f.trials) for f in self._flights.values())

    def _wanted(self, target: int) -> bool:
        """Whether another trial should be asked: the study is short of ``target`` and the grid is not used up."""
        done = sum(1 for t in self.study.get_trials(deepcopy=False) if counted(t))
        return done + self._in_flight() < target and not self._grid_used_up()

    def _loop(self, target: int) -> None:
        invalid_in_row = 0
        while True:
            while self._in_flight() < self.parallel and self._wanted(target):
                flight, invalid = self._new_trial()
                if invalid:
                    invalid_in_row += 1
                    if invalid_in_row >= MAX_CONSECUTIVE_INVALID:
                        raise ConfigError(f"{self.spec.path}: sweep: the last {invalid_in_row} sampled combinations "
                                          f"were all rejected (last: {invalid}); narrow sweep.params")
                    continue
                invalid_in_row = 0
            launches = [f for f in self._flights.values() if not f.launched]
            if launches:
                self._launch(launches)  # locally: runs them here and now
            if not self._flights:
                if not self._wanted(target):
                    return
                continue  # local runs ended (or were pruned) during the launch: ask for more
            self._poll()
            if self._flights and (self.profile.executor != "local" or not launches):
                time.sleep(self.poll_s)  # Slurm jobs, or runs executed by another process

    def _grid_used_up(self) -> bool:
        if self.spec.sweep.sampler != "grid":
            return False
        size = math.prod(len(values) for values in self.space.grid().values())
        started = sum(1 for t in self.study.get_trials(deepcopy=False)
                      if "grid_id" in t.system_attrs and (t.state.is_finished() or t.state.name == "RUNNING"))
        if started >= size:
            note = f"all {size} combinations of the grid were tried"
            if note not in self.notes:
                self.notes.append(note)
            return True
        return False

    def _new_trial(self) -> tuple[_Flight | None, str | None]:
        """Ask a trial and attach it to its run; (flight or None when finished at once, invalid reason)."""
        trial = self.study.ask(self.space.distributions)
        label = _label(trial.params)
        assignment = self.space.assignment(trial.params)
        entry = self.space.excluded_by(assignment)
        try:
            if entry is not None:
                raise ConfigError(f"excluded by the spec's exclude entry {entry}")
            run = self.spec.resolve(assignment, ("sweep", "params"))
            self._check_objective_metric(run.config)
        except ConfigError as err:
            if isinstance(err, _MetricMismatch):  # a spec error: stop the sweep
                trial.set_user_attr("invalid", True)
                self._tell(trial, "FAIL", reason=str(err))
                raise
            reason = f"invalid combination: {err}"
            trial.set_user_attr("invalid", True)
            self._tell(trial, "FAIL", reason=reason)
            self.echo(f"trial {trial.number}: {label}: skipped, the spec rejects it ({err})")
            return None, str(err)
        trial.set_user_attr("run_id", run.run_id)
        flight = self._flights.get(run.run_id)
        if flight is not None:  # the same run is already training for another trial
            flight.trials.append(trial)
            flight.reported[trial.number] = set()
            self.echo(f"trial {trial.number}: {label}: run {run.run_id} (already training for trial "
                      f"{flight.trials[0].number})")
            return flight, None
        flight = _Flight(run.config, self.spec.run_dir(self.results_root, run.run_id), [trial], {trial.number: set()})
        return self._place(flight, label), None

    def _check_objective_metric(self, config: RunConfig) -> None:
        problem = self.objective.metric_problem(config)
        if problem:
            where = self.space.where("sweep", "objective", "metric") if self.space.where else \
                f"{self.spec.path}: sweep.objective.metric"
            raise _MetricMismatch(f"{where}: {problem}")

    def _place(self, flight: _Flight, label: str) -> _Flight | None:
        """Decide what a new or adopted flight needs: reuse a done run, watch a live one, or launch."""
        state, _ = run_states({flight.run_id: flight.run_dir})[flight.run_id]
        numbers = ", ".join(str(t.number) for t in flight.trials)
        if state == "done":
            self.echo(f"trial {numbers}: {label}: run {flight.run_id} is done: reused")
            self._finish(flight, "done")
            return None
        self._flights[flight.run_id] = flight
        if state in ("pending", "running"):
            flight.launched = True
            flight.job_id = _job_id(flight.run_dir)
            self.echo(f"trial {numbers}: {label}: run {flight.run_id} is {state} already: watching it")
        else:
            self.echo(f"trial {numbers}: {label}: run {flight.run_id}")
        return flight

    def _adopt_orphans(self) -> None:
        """Trials left RUNNING by an interrupted sweep: watch their runs again, or relaunch them."""
        import optuna

        for frozen in self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            trial = optuna.trial.Trial(self.study, frozen._trial_id)
            run_id = frozen.user_attrs.get("run_id")
            config = None
            if run_id:
                stored = RunStore(self.spec.run_dir(self.results_root, run_id), run_id).read_json("spec.json")
                config = RunConfig.from_dict(stored) if stored else None
            if config is None:
                self._tell(trial, "FAIL", reason="the sweep was interrupted before this trial's run was launched")
                continue
            if run_id in self._flights:
                self._flights[run_id].trials.append(trial)
                self._flights[run_id].reported[trial.number] = set(frozen.intermediate_values)
                continue
            flight = _Flight(config, self.spec.run_dir(self.results_root, run_id), [trial],
                             {trial.number: set(frozen.intermediate_values)})
            self.echo(f"trial {trial.number}: taken up again from the interrupted sweep")
            self._place(flight, _label(frozen.params))

    # -- launching ----------------------------------------------------------------------------

    def _launch(self, flights: list[_Flight]) -> None:
        from solbench.spec import PlannedRun

        runs = [PlannedRun(f.config, {}) for f in flights]
        preflight(self.spec, runs)
        if self.profile.executor == "local":
            for flight in flights:
                self._execute_here(flight)
            return
        submission = launch_slurm(self.spec, runs, self.results_root, self.profile, run_fn=self.run_fn,
                                  sys_path=self.sys_path)
        for flight in flights:
            flight.launched = True
            flight.job_id = submission.job_ids.get(flight.run_id)
            for trial in flight.trials:
                trial.set_user_attr("job_id", flight.job_id)
        self.echo(f"submitted {len(flights)} trial run(s) to Slurm: "
                  f"{', '.join(f'{f.run_id} (job {f.job_id})' for f in flights)}")

    def _execute_here(self, flight: _Flight) -> None:
        from solbench.spec import PlannedRun

        store = prepare_run(PlannedRun(flight.config, {}), flight.run_dir, force=False)
        flight.launched = True
        task = RunTask(str(store.run_dir), flight.config.to_dict(), self.run_fn, self.sys_path)

        def listener(run_id: str, step: int, phase: str, info: dict) -> None:
            if self._observe(flight):
                raise _StopRun(step)

        try:
            execute_run(task, progress=listener)
        except _StopRun:
            self._record_pruned_run(flight)

    # -- watching -----------------------------------------------------------------------------

    def _observe(self, flight: _Flight) -> bool:
        """Report new evaluation points of a flight's run; True when its trials should be pruned."""
        path = flight.store.table_path("metrics")
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if size == flight.metrics_size or flight.stopping:
            return False
        flight.metrics_size = size
        if self.objective.multi:  # Optuna prunes single-objective studies only
            return False
        curve = self.objective.curve(flight.store.read("metrics"))
        new = False
        for trial in flight.trials:
            seen = flight.reported.setdefault(trial.number, set())
            for point in curve:
                if point.step not in seen:
                    trial.report(self.objective.intermediate(point), point.step)
                    seen.add(point.step)
                    new = True
        if not new or not curve or curve[-1].step >= flight.config.iterations:
            return False  # nothing new, or the final evaluation: nothing left to save by stopping
        owner = flight.trials[0]
        if owner.should_prune():
            flight.pruned_at = curve[-1].step
            self._prune(flight)
            return True
        return False

    def _prune(self, flight: _Flight) -> None:
        """Tell the study its trials are pruned and stop the run (cancel its job on Slurm)."""
        flight.stopping = True
        self._flights.pop(flight.run_id, None)
        for trial in flight.trials:
            self._tell(trial, "PRUNED", reason=f"pruned at step {flight.pruned_at}")
        self.echo(f"trial {', '.join(str(t.number) for t in flight.trials)}: pruned at step {flight.pruned_at} "
                  f"(run {flight.run_id})")
        if self.profile.executor != "local":
            job = flight.job_id or _job_id(flight.run_dir)
            if job:
                _scancel(job)
            self._stopping[flight.run_id] = flight

    def _record_pruned_run(self, flight: _Flight) -> None:
        store = flight.store
        status = store.read_status()
        store.write_status("failed", pruned=True,
                           error=f"pruned by sweep {study_name(self.spec)!r} at step {flight.pruned_at}",
                           slurm_job_id=status.get("slurm_job_id"))

    def _poll(self) -> None:
        for flight in list(self._flights.values()):
            self._observe(flight)
        self._check_stopping()
        if not self._flights:
            return
        states = run_states({f.run_id: f.run_dir for f in self._flights.values()})
        for run_id, (state, status) in states.items():
            flight = self._flights.get(run_id)
            if flight is None:
                continue
            if state in ("done", "failed"):
                self._flights.pop(run_id)
                self._finish(flight, state, status.get("error"))
            elif state in ("interrupted", "new"):
                if flight.relaunches >= MAX_RELAUNCHES:
                    self._flights.pop(run_id)
                    self._finish(flight, "failed", f"run {state} after {flight.relaunches + 1} launches (job "
                                                   "cancelled or killed outside the sweep)")
                    continue
                if flight.launched:
                    flight.relaunches += 1
                    self.echo(f"run {run_id} was {state}: launching it again (resumes from its checkpoint)")
                flight.launched = False
                self._launch([flight])

    def _check_stopping(self) -> None:
        """Record pruned Slurm runs as pruned once their cancelled job is gone (one that finished
        before the cancel landed stays done)."""
        if not self._stopping:
            return
        states = run_states({run_id: flight.run_dir for run_id, flight in self._stopping.items()})
        for run_id, (state, _) in states.items():
            if state not in ("pending", "running"):
                if state == "interrupted":
                    self._record_pruned_run(self._stopping[run_id])
                self._stopping.pop(run_id)

    def _wait_for_stopping(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self._stopping and time.monotonic() < deadline:
            self._check_stopping()
            if self._stopping:
                time.sleep(min(self.poll_s, 1.0))
        for run_id in self._stopping:
            log.warning("pruned run %s still had a live job when the sweep ended", run_id)

    def _finish(self, flight: _Flight, state: str, error: str | None = None) -> None:
        """Tell the study the outcome of a flight's run: its objective, or why it has none."""
        rows = flight.store.read("metrics")
        curve = [] if self.objective.multi else self.objective.curve(rows)
        for trial in flight.trials:  # intermediate values of a reused run, so later pruning sees them
            seen = flight.reported.setdefault(trial.number, set())
            for point in curve:
                if point.step not in seen:
                    trial.report(self.objective.intermediate(point), point.step)
                    seen.add(point.step)
        numbers = ", ".join(str(t.number) for t in flight.trials)
        if state != "done":
            for trial in flight.trials:
                self._tell(trial, "FAIL", reason=f"run {flight.run_id} failed: {error or 'see its status.json'}")
            self.echo(f"trial {numbers}: run {flight.run_id} failed ({error})")
            return
        try:
            values = self.objective.values(rows, flight.store.read("timings") if self.objective.multi else (),
                                           flight.config)
        except ObjectiveError as err:
            for trial in flight.trials:
                self._tell(trial, "FAIL", reason=f"run {flight.run_id}: {err}")
            self.echo(f"trial {numbers}: no objective: {err}")
            return
        for trial in flight.trials:
            self._tell(trial, "COMPLETE", value=values if self.objective.multi else values[0])
        self.echo(f"trial {numbers}: {', '.join(f'{v:.6g}' for v in values)} (run {flight.run_id})")

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


class _MetricMismatch(ConfigError):
    """The objective's metric is not evaluated by the runs: a spec error, not an invalid combination."""


def _label(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def run_sweep(spec, results_root: str | Path = "results", *, trials: int | None = None, **kwargs: Any) -> SweepResult:
    """Run or continue ``spec``'s sweep (see ``Sweep``); returns the study and what happened."""
    return Sweep(spec, results_root, **kwargs).run(trials)
