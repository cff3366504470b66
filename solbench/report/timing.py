"""Timing (the paper's Table 5): seconds per iteration, rollout and end to end, and phase breakdown.

From timings.parquet (one row per timed phase span). Per run and training iteration:
- rollout seconds = the sum over the rollout phases (explore, select, regenerate, rollout, reward);
- end-to-end seconds = the sum over every phase of the iteration except evaluation.
The first ``warmup`` iterations of each run are dropped (compilation, caches), then each run gives
its median over the remaining iterations; an arm reports the mean of its runs' medians with a t
interval over seeds. The speedup is baseline / target of those means, with a t interval of the log ratio
over each arm's seeds (``stats.ratio_ci``; a percentile bootstrap over 2-3 seeds undercovers). Phases are summed as disjoint spans: nested phases would be
counted twice (the harness's phases are not nested in the training loop).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from solbench.report.plotting import arm_labels, clip, legend_below, new_figure, phase_colour
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import fmt_ci, fmt_num, mean_ci, ratio_ci
from solbench.report.tables import EVAL_PHASES, PHASE_ORDER, Tables, same_method


def iteration_seconds(tables: Tables) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """(per-iteration totals, per-iteration per-phase seconds, warm-up fallback used) for done runs.

    The first frame has run_id, step, rollout_s, e2e_s; the second run_id, step, phase, seconds.
    Warm-up iterations are already removed; when a run has no iteration left after the warm-up,
    all of its iterations are kept and the flag is True.
    """
    runs = tables.done_runs
    t = tables.timings[tables.timings["run_id"].isin(runs["run_id"]) & ~tables.timings["phase"].isin(EVAL_PHASES)]
    t = t.dropna(subset=["step", "seconds"])
    if t.empty:
        return (pd.DataFrame(columns=["run_id", "step", "rollout_s", "e2e_s"]),
                pd.DataFrame(columns=["run_id", "step", "phase", "seconds"]), False)
    kept, fallback = [], False
    for _run_id, group in t.groupby("run_id", sort=False):
        steps = sorted(group["step"].unique())
        keep = steps[tables.options.warmup:]
        if not keep:
            keep, fallback = steps, True
        kept.append(group[group["step"].isin(keep)])
    t = pd.concat(kept, ignore_index=True)
    per_phase = t.groupby(["run_id", "step", "phase"], as_index=False)["seconds"].sum()
    rollout = tables.rollout_phases()  # as the runs' methods declared them (fallback: ROLLOUT_PHASES)
    totals = per_phase.groupby(["run_id", "step"]).apply(
        lambda g: pd.Series({"rollout_s": g.loc[g["phase"].isin(rollout), "seconds"].sum(),
                             "e2e_s": g["seconds"].sum()}), include_groups=False).reset_index()
    return totals, per_phase, fallback


def per_run_medians(tables: Tables) -> tuple[pd.DataFrame, pd.DataFrame, bool]:
    """(run medians of rollout_s and e2e_s with run info, run medians per phase, warm-up fallback)."""
    totals, per_phase, fallback = iteration_seconds(tables)
    info = tables.done_runs[["run_id", "model", "method", "arm", "seed"]]
    med = totals.groupby("run_id")[["rollout_s", "e2e_s"]].median().reset_index().merge(info, on="run_id")
    # a phase absent from an iteration took 0 s in it: fill before the median
    wide = per_phase.pivot_table(index=["run_id", "step"], columns="phase", values="seconds", aggfunc="sum", fill_value=0.0)
    phase_med = wide.groupby("run_id").median().reset_index().melt(id_vars="run_id", var_name="phase", value_name="seconds")
    phase_med = phase_med.merge(info, on="run_id")
    return med, phase_med, fallback


#: Other programs' busy cores (on a run's own cores, the 90th percentile of its iterations: run_load) above which its
#: timings are flagged as measured under contention.
CONTENTION = 0.25


def run_load(tables: Tables) -> pd.DataFrame:
    """Per done run: ``load``, the 90th percentile over its training iterations of how many of its cores other
    programs kept busy (timings.load, seconds-weighted within an iteration): the busiest part of the run, which a
    median or mean hides when other work ran beside a part of it; ``load_mean`` (seconds-weighted over the run)
    and ``load_max`` (its busiest iteration); empty when no row recorded a load."""
    t = tables.timings
    cols = ["run_id", "load", "load_mean", "load_max"]
    if "load" not in t:
        return pd.DataFrame(columns=cols)
    t = t[t["run_id"].isin(tables.done_runs["run_id"]) & ~t["phase"].isin(EVAL_PHASES)].copy()
    t["load"] = pd.to_numeric(t["load"], errors="coerce")
    t = t.dropna(subset=["load", "seconds"])
    t = t[t["seconds"] > 0]
    if t.empty:
        return pd.DataFrame(columns=cols)
    t["busy"] = t["load"] * t["seconds"]
    per_iter = t.groupby(["run_id", "step"])[["busy", "seconds"]].sum()
    per_iter["load"] = per_iter["busy"] / per_iter["seconds"]
    runs = per_iter.groupby("run_id").agg(busy=("busy", "sum"), seconds=("seconds", "sum"), load_max=("load", "max"),
                                          load=("load", lambda v: float(np.quantile(v, LOAD_QUANTILE))))
    runs["load_mean"] = runs["busy"] / runs["seconds"]
    return runs.reset_index()[cols]


#: The part of a run its load check reads: the 90th percentile of its iterations' loads (issue 53)
LOAD_QUANTILE = 0.9


def contention_note(tables: Tables, loads: pd.DataFrame) -> Note:
    """Which runs were timed beside other programs (their load above CONTENTION), or that none was."""
    if loads.empty:
        return Note("Load", "These timings carry no load (the runs did not record timings.load): whether other "
                    "programs shared their cores is unknown.", level="warning")
    info = tables.done_runs.set_index("run_id")
    busy = loads[loads["load"] > CONTENTION].sort_values("load", ascending=False)
    if busy.empty:
        return Note("Load", f"No run was timed under contention: other programs kept at most "
                    f"{loads['load'].max():.2f} of a run's cores busy in its busiest tenth of iterations (90th "
                    f"percentile; flag above {CONTENTION}).")
    lines = [f"- `{r.run_id}` ({info.loc[r.run_id, 'arm']}, seed {info.loc[r.run_id, 'seed']}): other programs kept "
             f"{r.load:.2f} of its cores busy at its 90th percentile iteration (busiest {r.load_max:.2f})" for r in busy.itertuples()]
    return Note("Measured under contention", (
        f"{len(busy)} of {len(loads)} runs were timed while other programs kept more than {CONTENTION} of their cores "
        "busy; their seconds (and any speedup built on them) are slower than the same work on quiet cores, so they "
        "are flagged in the table below (column `load`) and should not be compared with quiet runs:\n"
        + "\n".join(lines)), level="warning")


def quiet_runs(tables: Tables, med: pd.DataFrame, loads: pd.DataFrame | None = None) -> tuple[set[str], str]:
    """(the run ids of ``med`` timed on quiet cores, a sentence saying which were left out and why): a speed
    finding compares timings of quiet runs only. Runs that recorded no load are kept (and the sentence says
    the load is unknown). ``loads``: run_load(tables), where the caller has it already."""
    if med.empty:
        return set(), ""
    loads = run_load(tables) if loads is None else loads
    ids = set(med["run_id"])
    if loads.empty or not ids & set(loads["run_id"]):
        return ids, "The load on these runs' cores was not recorded: whether other programs shared them is unknown."
    busy = loads[loads["run_id"].isin(ids) & (loads["load"] > CONTENTION)]
    if busy.empty:
        return ids, (f"No run of these arms was timed under contention (other programs' load at most "
                     f"{loads.loc[loads['run_id'].isin(ids), 'load'].max():.2f} of a run's cores; flag above "
                     f"{CONTENTION}).")
    arm = med.set_index("run_id")["arm"]
    left = ", ".join(f"`{r.run_id}` ({arm[r.run_id]}, load {r.load:.2f})" for r in busy.itertuples())
    kept = ids - set(busy["run_id"])
    none_left = [a for a in dict.fromkeys(med["arm"]) if not set(med.loc[med["arm"] == a, "run_id"]) & kept]
    return kept, (f"Left out as timed under contention (load above {CONTENTION}): {left}."
                  + (f" None of {', '.join(none_left)} is left: no measured speed for it." if none_left else ""))


def _ratio_of_means(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(a) / np.mean(b)) if np.mean(b) > 0 else math.nan


def _speedup(base: np.ndarray, target: np.ndarray, tables: Tables) -> tuple[float, float, float]:
    point = _ratio_of_means(base, target)
    lo, hi = ratio_ci(base, target, level=tables.options.ci_level)  # issue 48: a t interval, not a 2-3 seed bootstrap
    return point, lo, hi


def _fmt_speedup(point: float, lo: float, hi: float) -> str:
    if not math.isfinite(point):
        return "-"
    if math.isfinite(lo):
        return f"{point:.2f}x [{lo:.2f}, {hi:.2f}]"
    return f"{point:.2f}x"


EMULATED = "Measured on emulated FP4"  # the caveat's title


def judged_runs(tables: Tables) -> pd.DataFrame:
    """The runs whose explore clock Table 5 judges: each model's main Sol-RL arm (findings_common.main_arm; the
    arm Table 5's Findings compare), all done runs where there is none. Arms on other explore copies (tiny_paper's
    dose-response on MXFP4, which has no cpu_bf16 kernel) are listed with their backend, not judged."""
    from solbench.report.findings_common import main_arm

    runs = tables.done_runs
    arms = {main_arm(tables, runs[runs["model"] == model], tables.options.target_method) for model in tables.models()}
    arms.discard(None)
    return runs[runs["arm"].isin(arms)] if arms else runs


def emulation_caveat(tables: Tables, runs: pd.DataFrame | None = None) -> Note | None:
    """The CPU / emulated-FP4 caveat, when it applies to ``runs`` (default: every done run): None where every explore
    copy of them computed on low-precision units (a GPU backend, or cpu_bf16 on a CPU: ``low_precision_note`` says
    which)."""
    devices = tables.device_kinds()
    runs = tables.done_runs if runs is None else runs
    explore_runs = set(tables.timings.loc[tables.timings["precision"] == "explore", "run_id"])
    from solbench.report.explore import on_low_precision_units

    if explore_runs and on_low_precision_units(runs[runs["run_id"].isin(explore_runs)]):
        return None
    emulated = False
    if "p_quant.backend" in runs:
        backends = runs.loc[runs["run_id"].isin(explore_runs), "p_quant.backend"].dropna().astype(str)
        emulated = bool(len(backends)) and (backends == "emulated").any()
    if "cpu" in devices or emulated:
        why = "on CPU" if "cpu" in devices else "with the emulated quantization backend"
        return Note(EMULATED, (
            f"These timings were measured {why}: low-precision (FP4) rollouts are emulated (fake-quantized in "
            "full precision), which costs more than full precision instead of less, so the explore stage and any "
            "speedup below say nothing about FP4 hardware. For planning GPU time use the cost projection "
            "section (labelled as a projection)."), level="warning")
    return None


def low_precision_note(tables: Tables, among: pd.DataFrame | None = None) -> Note | None:
    """On CPU, where the explore copies (of ``among``, default every done run) computed on the CPU's bf16 units: what
    the measured clock compares."""
    from solbench.report.explore import explore_runs, on_low_precision_units

    runs = explore_runs(tables)
    if among is not None:
        runs = runs[runs["run_id"].isin(among["run_id"])]
    if "cpu" not in tables.device_kinds() or runs.empty or not on_low_precision_units(runs):
        return None
    return Note("Measured on the CPU's bf16 units", (
        f"The explore copies computed on {cpu_label(tables)} with backend cpu_bf16: the recipe's NVFP4 values (exact "
        "in bf16) multiplied on the CPU's bf16 units, everything else in fp32, against full precision in fp32. The "
        "measured speedups below are judged: they are this CPU's low-precision units against its fp32 units, the "
        "CPU's counterpart of FP4 against BF16 tensor cores, not a measurement of FP4 hardware."))


def _other_backends_note(tables: Tables, judged: pd.DataFrame) -> Note:
    """The arms whose explore copies were emulated beside a judged arm on low-precision units."""
    from solbench.report.explore import explore_backends, explore_runs, low_precision_backends

    runs = explore_runs(tables)
    others = runs[~runs["run_id"].isin(judged["run_id"])]
    arms = [a for a in tables.arm_order(others)
            if not explore_backends(others[others["arm"] == a]) <= low_precision_backends(runs)]
    return Note("Other arms on emulated FP4", (
        f"{len(arms)} arm(s) explored with the emulated backend (fake-quantized in full precision, slower than full "
        f"precision): {'; '.join(arms)}. Their explore seconds in the tables below say nothing about low-precision "
        "units and no finding judges them; the judged clock is the main Sol-RL arm's above."))


def cpu_label(tables: Tables) -> str:
    """'AMD EPYC (avx512_bf16)': the CPU model(s) of the done runs and their bf16 flags, from env.json."""
    runs = tables.done_runs
    models = sorted({str(v) for v in runs.get("cpu_model", pd.Series(dtype=object)).dropna()})
    flags = sorted({str(v) for v in runs.get("cpu_bf16_flags", pd.Series(dtype=object)).dropna() if str(v)})
    text = " / ".join(models) or "this CPU"
    return text + (f" ({', '.join(flags)})" if flags else "")


@report_kind("timing", title="Timing (Table 5)", order=20)
def timing(tables: Tables):
    """Seconds per iteration (rollout, end to end), naive BF16 scaling vs Sol-RL, and per-phase bars."""
    med, phase_med, fallback = per_run_medians(tables)
    if med.empty:
        return Note("Timing", "No timings of done runs in timings.parquet: nothing to report.")
    opts, level = tables.options, tables.options.ci_level
    outputs: list = []
    judged = judged_runs(tables)
    caveat = emulation_caveat(tables, judged) or low_precision_note(tables, judged)
    if caveat:
        outputs.append(caveat)
    if (caveat is None or caveat.title != EMULATED) and emulation_caveat(tables) is not None:
        outputs.append(_other_backends_note(tables, judged))
    loads = run_load(tables)
    outputs.append(contention_note(tables, loads))
    load_of = loads.set_index("run_id")["load"] if not loads.empty else pd.Series(dtype=float)
    if fallback:
        outputs.append(Note("Warm-up", f"Some runs have no more than {opts.warmup} timed iteration(s): "
                                       "their medians include the warm-up iterations.", level="warning"))

    # Table 5 layout: naive BF16 scaling vs Sol-RL, from the runs timed on quiet cores
    from solbench.report.explore import explore_text

    quiet, load_text = quiet_runs(tables, med, loads)
    pairs = []
    for model in sorted(med["model"].unique()):
        m = med[(med["model"] == model) & med["run_id"].isin(quiet)]
        bases = [a for a in tables.arm_order(tables.done_runs) if a in set(m.loc[m["method"].map(lambda x: same_method(x, opts.baseline_method)), "arm"])]
        targets = [a for a in tables.arm_order(tables.done_runs) if a in set(m.loc[m["method"].map(lambda x: same_method(x, opts.target_method)), "arm"])]
        for b in bases:
            for t in targets:
                rb, rt = m[m["arm"] == b], m[m["arm"] == t]
                row = dict(model=model, baseline=b, target=t, n_seeds_baseline=len(rb), n_seeds_target=len(rt),
                           explore=explore_text(tables.done_runs[tables.done_runs["arm"] == t],
                                                with_share=tables.fidelity_runs))
                for col, name in (("rollout_s", "rollout"), ("e2e_s", "e2e")):
                    cb, ct = mean_ci(rb[col].values, level), mean_ci(rt[col].values, level)
                    sp = _speedup(rb[col].values, rt[col].values, tables)
                    row.update({f"{name}_baseline_s": cb.mean, f"{name}_baseline_lo": cb.lo, f"{name}_baseline_hi": cb.hi,
                                f"{name}_target_s": ct.mean, f"{name}_target_lo": ct.lo, f"{name}_target_hi": ct.hi,
                                f"{name}_speedup": sp[0], f"{name}_speedup_lo": sp[1], f"{name}_speedup_hi": sp[2]})
                pairs.append(row)
    if pairs:
        tidy = pd.DataFrame(pairs)
        display = pd.DataFrame([{
            "model": r["model"], "baseline": r["baseline"], "target": r["target"],
            "target's explore (format, recipe, backend)": r["explore"],
            "rollout baseline (s)": fmt_ci(mean_ci_from(r, "rollout_baseline")),
            "rollout target (s)": fmt_ci(mean_ci_from(r, "rollout_target")),
            "rollout speedup": _fmt_speedup(r["rollout_speedup"], r["rollout_speedup_lo"], r["rollout_speedup_hi"]),
            "E2E baseline (s)": fmt_ci(mean_ci_from(r, "e2e_baseline")),
            "E2E target (s)": fmt_ci(mean_ci_from(r, "e2e_target")),
            "E2E speedup": _fmt_speedup(r["e2e_speedup"], r["e2e_speedup_lo"], r["e2e_speedup_hi"]),
        } for r in pairs])
        outputs.append(Table("timing_table5", "Seconds per iteration: naive BF16 scaling vs Sol-RL", tidy, (
            "Mirrors the paper's Table 5 (measured). Seconds per training iteration: rollout = explore + select + "
            "regenerate + rollout + reward phases; E2E = every phase of the iteration except evaluation. Each run "
            f"gives its median over iterations after {opts.warmup} warm-up iteration(s); cells are the mean over "
            f"seeds ± half-width of the {level:.0%} t interval. Speedup = baseline / target seconds, with a "
            f"{level:.0%} t interval of the log ratio over seeds (delta method, Welch df) when both arms have 2+ seeds. "
            f"Only runs timed on quiet cores: {load_text} The target's explore column names the low-precision "
            "format, recipe and backend its seconds were measured with. "
            "The paper's numbers (8x B200) are in the cost projection section."), display=display))
    else:
        both = [model for model in med["model"].unique()
                if all(med.loc[med["model"] == model, "method"].map(lambda x, w=w: same_method(x, w)).any()
                       for w in (opts.baseline_method, opts.target_method))]
        why = (f"every run of `{opts.baseline_method}` or of `{opts.target_method}` was timed under contention "
               f"(other programs' load above {CONTENTION}), so no quiet pair is left to compare" if both else
               f"no done runs of both `{opts.baseline_method}` and `{opts.target_method}` on the same model")
        outputs.append(Note("Table 5 pair", f"No speedup table from the training runs: {why} (per-arm timings "
                                           "follow; the spec's speed block times the arms alone)."))
    # every arm, with the per-phase medians
    explore_ids = set(tables.timings.loc[tables.timings["precision"] == "explore", "run_id"])
    phases = _phase_order(phase_med["phase"].unique())
    rows, display_rows = [], []
    for model in sorted(med["model"].unique()):
        m = med[med["model"] == model]
        base_arms = [a for a in m["arm"].unique() if same_method(m.loc[m["arm"] == a, "method"].iloc[0], opts.baseline_method)]
        base_vals = m.loc[m["arm"] == base_arms[0], "e2e_s"].values if base_arms else None
        for arm in tables.arm_order(tables.done_runs):
            a = m[m["arm"] == arm]
            if a.empty:
                continue
            roll, e2e = mean_ci(a["rollout_s"].values, level), mean_ci(a["e2e_s"].values, level)
            run_loads = a["run_id"].map(load_of).dropna()
            contended = int((run_loads > CONTENTION).sum())
            row = dict(model=model, arm=arm, method=a["method"].iloc[0], n_seeds=len(a), rollout_s=roll.mean,
                       rollout_lo=roll.lo, rollout_hi=roll.hi, e2e_s=e2e.mean, e2e_lo=e2e.lo, e2e_hi=e2e.hi,
                       load_max=float(run_loads.max()) if len(run_loads) else np.nan, contended_runs=contended)
            pm = phase_med[(phase_med["model"] == model) & (phase_med["arm"] == arm)].groupby("phase")["seconds"].mean()
            explores = tables.done_runs[tables.done_runs["run_id"].isin(set(a["run_id"]) & explore_ids)]
            disp = {"model": model, "method": arm, "seeds": str(len(a)),
                    "explore (format, recipe, backend)": explore_text(explores) if len(explores) else "-",
                    "rollout (s)": fmt_ci(roll), "E2E (s)": fmt_ci(e2e),
                    "load": ("-" if run_loads.empty else f"{run_loads.max():.2f}"
                             + (f" (**{contended} run{'s' if contended > 1 else ''} contended**)" if contended else ""))}
            for phase in phases:
                row[f"phase_{phase}_s"] = float(pm.get(phase, 0.0))
                disp[phase] = fmt_num(float(pm.get(phase, 0.0)), 3)
            if base_vals is not None and arm == base_arms[0]:
                row.update(e2e_speedup_vs_baseline=1.0, e2e_speedup_lo=math.nan, e2e_speedup_hi=math.nan)
                disp[f"E2E speedup vs {base_arms[0]}"] = "1 (baseline)"
            elif base_vals is not None:
                sp = _speedup(base_vals, a["e2e_s"].values, tables)
                row.update(e2e_speedup_vs_baseline=sp[0], e2e_speedup_lo=sp[1], e2e_speedup_hi=sp[2])
                disp[f"E2E speedup vs {base_arms[0]}"] = _fmt_speedup(*sp)
            rows.append(row)
            display_rows.append(disp)
    outputs.append(Table("timing_phases", "Seconds per iteration by method and phase", pd.DataFrame(rows), (
        "Every method, measured. Rollout and E2E as in the table above (mean of per-run medians ± "
        f"{level:.0%} t half-width over seeds). load: the most other programs kept of a run's cores busy (mean over "
        f"its training phases, the busiest run of the arm); runs above {CONTENTION} are contended (the note above). "
        "Phase columns: mean over seeds of each run's median seconds "
        "per iteration spent in that phase (0 where a method has no such phase); medians of phases need not "
        "add up to the median of the totals."), display=pd.DataFrame(display_rows)))
    contended_arms = {r["arm"] for r in rows if r["contended_runs"]}
    outputs.append(_phase_figure(tables, phase_med, phases, contended_arms))
    return outputs


def mean_ci_from(row: dict, prefix: str):
    from solbench.report.stats import CI

    return CI(row[f"{prefix}_s"], row[f"{prefix}_lo"], row[f"{prefix}_hi"], 0)


def _phase_order(phases) -> list[str]:
    phases = list(phases)
    return [p for p in PHASE_ORDER if p in phases] + sorted(p for p in phases if p not in PHASE_ORDER)


def _phase_figure(tables: Tables, phase_med: pd.DataFrame, phases: list[str], contended: set[str] = frozenset()) -> Figure:
    models = sorted(phase_med["model"].unique())
    # horizontal bars, one row per arm, labels on the y axis at a readable size: vertical bars each as wide as its
    # label made tiny_paper's 16 arms a 2774 x 462 px strip with 5 px text (issue 48)
    n_arms = int(phase_med.groupby("model")["arm"].nunique().max())
    labels = arm_labels(tables, tables.arm_order(tables.done_runs))
    fig = new_figure(6.0 + 3.2 * min(len(models), 2), 1.4 + 0.42 * n_arms)
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    plotted = []
    for ax, model in zip(axes, models):
        pm = phase_med[phase_med["model"] == model].groupby(["arm", "phase"])["seconds"].mean().unstack(fill_value=0.0)
        arms = [a for a in tables.arm_order(tables.done_runs) if a in pm.index]
        pm = pm.reindex(arms)
        y = np.arange(len(arms))[::-1]  # the first arm on top
        left = np.zeros(len(arms))
        for i, phase in enumerate(phases):
            values = pm[phase].values if phase in pm else np.zeros(len(arms))
            ax.barh(y, values, left=left, color=phase_colour(phase, i), label=phase, edgecolor="white", linewidth=0.5,
                    height=0.7)
            left += values
        for yi, (arm, total) in zip(y, zip(arms, left)):
            mark = arm in contended
            ax.text(total, yi, f" {total:.3g}s" + (" contended" if mark else ""), ha="left", va="center", fontsize=8,
                    color="#b00000" if mark else "black", fontweight="bold" if mark else "normal")
            if mark:  # hatch the bar of an arm with a run timed beside other programs
                ax.barh([yi], [total], color="none", edgecolor="#b00000", hatch="//", linewidth=1.0, height=0.7)
        # one line per arm, its short label (solbench/report/labels.py): wrapped full labels overprinted each other
        ax.set_yticks(y, [labels[a] + (" *" if a in contended else "") for a in arms], fontsize=8)
        ax.set_ylabel("arm (short label)", fontsize=9)
        ax.set_xlabel("seconds per iteration (median over iterations, mean over seeds)", fontsize=9)
        ax.set_title(f"{clip(model)}: per-phase time per iteration", fontsize=10)
        ax.set_xlim(0, max(left.max() * 1.2, 1e-9))
        ax.grid(axis="x", alpha=0.3)
        plotted.append(pm.reset_index().melt(id_vars="arm", var_name="phase", value_name="seconds").assign(model=model))
    handles, names = axes[0].get_legend_handles_labels()
    legend_below(fig, handles, names, ncols=len(names), title="phase")
    return Figure("timing_phases_chart", "Per-phase time per iteration (stacked)", fig, (
        "Measured. One bar per arm, named by its short label (the arm table maps it to its settings). Stacked bars: "
        "mean over seeds of each run's median seconds per iteration in each phase, "
        f"after {tables.options.warmup} warm-up iteration(s); evaluation excluded. The paper's Table 5 splits "
        "the same iteration into rollout (explore/select/regenerate or rollout, plus reward) and the rest (train, sync)."
        + (f" Hatched, marked 'contended' and starred: arms with a run timed while other programs kept more than "
           f"{CONTENTION} of its cores busy ({', '.join(sorted(contended))}); their seconds are slower than the same "
           "work on quiet cores (the load note above)." if contended else "")),
        data=pd.concat(plotted, ignore_index=True))
