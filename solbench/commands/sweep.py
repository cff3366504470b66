"""`solbench sweep SPEC`: run (or continue) the Optuna study of a spec's ``sweep:`` block.

Each trial is an ordinary run of the spec under results/<experiment>/<run_id>/, launched like
`solbench run` launches (in this process, or as Slurm jobs with up to ``sweep.parallel`` in flight),
pruned from its evaluation rows, and scored by ``sweep.objective``. The study is stored in
results/<experiment>/sweep/, so running the command again continues it; ``--trials N`` sets how many
trials the study should hold. Prints the trials and the top one, writes sweep/trials.parquet (read
by the report's N x K heat map) and collects the experiment's runs into parquet, then prints the best set:
the cells whose eval-sample intervals cannot be told from the top (solbench/report/sweep_cells.py).
``--show`` only prints the study.
"""

from __future__ import annotations

import math

from solbench.commands._common import (add_results_argument, add_spec_argument, console, experiment_dir, print_notes,
                                       print_table)
from solbench.launch import DEFAULT_RUN_FN

HELP = "run or continue an Optuna sweep over a spec's axes (each trial an ordinary run), then print the best trial"


def add_arguments(parser) -> None:
    add_spec_argument(parser)
    add_results_argument(parser)
    parser.add_argument("--trials", type=int, default=None, metavar="N",
                        help="trials the study should hold when done (default: the spec's sweep.trials); "
                             "a larger number than last time adds trials")
    parser.add_argument("--launch", metavar="PROFILE", default=None,
                        help="launch profile overriding the spec's (local, debug, gpu, or a .yaml path)")
    parser.add_argument("--poll", type=float, default=5.0, metavar="SECONDS",
                        help="how often running trials' metrics are read on Slurm (default: 5)")
    parser.add_argument("--show", action="store_true", help="print the study's trials and best trial; run nothing")
    parser.add_argument("--no-collect", action="store_true", help="do not collect the runs into parquet at the end")
    parser.add_argument("--quiet", action="store_true", help="no line per trial event")
    parser.add_argument("--run-fn", default=DEFAULT_RUN_FN, metavar="MODULE:FUNCTION",
                        help="the function that executes one run (default: the trainer; for tests and extensions)")


def main(args) -> int:
    from solbench.spec import load_spec
    from solbench.sweep import Objective, Sweep, open_study, storage_path, study_name

    out = console()
    if not out.is_terminal:
        out.width = max(out.width, 160)  # logs: keep the trials table's columns whole
    spec = load_spec(args.spec)
    print_notes(out, spec)
    if spec.sweep is None:
        from solbench.errors import ConfigError

        raise ConfigError(f"{args.spec}: no sweep: block (see experiments/README.md, 'Sweeps')")
    objective = Objective.from_model(spec.sweep.objective, f"{args.spec}: sweep.objective")
    if args.show:
        study = open_study(spec, args.results, create=False)
        print_study(out, study, objective, storage_path(spec, args.results))
        return 0

    echo = (lambda line: None) if args.quiet else (lambda line: out.print(line, markup=False))
    sweep = Sweep(spec, args.results, profile_name=args.launch, run_fn=args.run_fn, poll_s=args.poll, echo=echo)
    printed = list(sweep.notes)
    for note in printed:
        out.print(f"note: {note}", markup=False)
    out.print(f"sweep {study_name(spec)!r}: {objective.describe()}; storage {storage_path(spec, args.results)}; "
              f"profile {sweep.profile_path}", markup=False)
    result = sweep.run(args.trials)
    for note in result.notes:
        if note not in printed:
            out.print(f"note: {note}", markup=False)
    print_study(out, result.study, objective, result.storage)
    out.print(f"trials table: {result.trials_path}", markup=False)
    if not args.no_collect:
        from solbench.commands.collect import print_collect
        from solbench.collect import collect

        print_collect(collect(experiment_dir(spec, args.results)))
        from solbench.report.sweep_cells import best_set_line, sweep_cells
        from solbench.report.tables import Tables

        out.print(best_set_line(*sweep_cells(Tables.load(experiment_dir(spec, args.results)))), markup=False)
        out.print(f"report: solbench report {args.spec} --results {args.results}", markup=False)
    return 0


def print_study(out, study, objective, storage) -> None:
    """The trials as a table, then the best one."""
    from solbench.sweep import counted

    trials = study.get_trials(deepcopy=False)
    names = list(dict.fromkeys(name for t in trials for name in t.params))
    notes = [t.user_attrs.get("reason") or "" if t.state.name == "FAIL" else "" for t in trials]
    rows = []
    for t, note in zip(trials, notes):
        value = "-" if not t.values else ", ".join(f"{v:.6g}" if math.isfinite(v) else str(v) for v in t.values)
        steps = sorted(t.intermediate_values)
        row = [str(t.number), t.state.name, value, *(str(t.params.get(n, "-")) for n in names),
               str(steps[-1]) if steps else "-", t.user_attrs.get("run_id") or "-"]
        rows.append(row + ([note] if any(notes) else []))
    columns = ["#", "state", "value", *names, "step", "run_id"] + (["note"] if any(notes) else [])
    print_table(out, columns, rows, title=f"study {study.study_name} ({storage}): {objective.describe()}")
    complete = [t for t in trials if t.state.name == "COMPLETE" and t.values]
    states = {}
    for t in trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    summary = ", ".join(f"{count} {state.lower()}" for state, count in sorted(states.items()))
    out.print(f"{sum(1 for t in trials if counted(t))} trials counted ({summary or 'none'})", markup=False)
    if not complete:
        out.print("best: none yet (no trial completed)", markup=False)
        return
    if len(study.directions) > 1:  # reward_and_time: Optuna's Pareto front
        front = ", ".join(f"#{t.number} ({', '.join(f'{k}={v}' for k, v in t.params.items())})" for t in study.best_trials)
        out.print(f"Pareto front (reward vs PROJECTED time, point estimates): {front}", markup=False)
        return
    best = study.best_trial
    params = ", ".join(f"{k}={v}" for k, v in best.params.items())
    out.print(f"top trial: #{best.number} value {best.value:.6g} ({params}) run {best.user_attrs.get('run_id')}; "
              "a single value, not judged against noise (the best set, after collect, and the report are)", markup=False)
