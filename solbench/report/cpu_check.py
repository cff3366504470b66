"""Table 5 on this CPU: the ratios a projection from this CPU's measured rates predicts, beside the clock.

The B200 / H100 projection (clock.py) prices counted FLOPs with published peaks and cannot be checked on
a CPU. Priced with the CPU's own rates, the same FLOP counts predict the CPU's rollout and E2E ratios, and
the measured ratios check them. The rates come from the runs (``cpu_rates.json``, solbench.train.cpu_rates,
collected as ``rate_*`` columns; the median over the runs that measured them) in two profiles:

- **GEMM rates**: full-precision FLOPs at the fp32 GEMM rate; explore FLOPs at the share the recipe
  quantizes (solbench.models.shares) at the bf16 GEMM rate, the rest at fp32: what a FLOP-count
  projection assumes (the B200 rows are this at NVFP4 and BF16 peaks);
- **forward rates**: full-precision FLOPs at the rate of a whole full-precision forward, explore FLOPs at
  the rate of a whole explore forward (input quantizer, attention, norms and activations included).

Phases the runs timed without a FLOP count (prompt draw, selection, rewards) add nothing to a
prediction, so an E2E prediction omits them and says so; the gap between the two profiles is the
forward's time outside its GEMMs.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.registry import Table, report_kind
from solbench.report.stats import fmt_num
from solbench.report.tables import EVAL_PHASES, Tables

RATE_COLUMNS = {"gemm": ("rate_gemm_fp32", "rate_gemm_bf16"), "forward": ("rate_forward_full", "rate_forward_explore")}
TOLERANCE = 0.15  # the bar: a prediction within 15 % of the measured ratio


def cpu_rates(tables: Tables) -> dict[str, tuple[float, float]] | None:
    """{profile: (full-precision GFLOP/s, explore GFLOP/s)}, medians over the runs that measured them; None when none did."""
    runs = tables.done_runs
    out = {}
    for profile, (full, low) in RATE_COLUMNS.items():
        if full in runs and low in runs:
            f, lo = pd.to_numeric(runs[full], errors="coerce").dropna(), pd.to_numeric(runs[low], errors="coerce").dropna()
            if len(f) and len(lo):
                out[profile] = (float(f.median()), float(lo.median()))
    return out or None


def predicted_seconds(proj: pd.DataFrame, profile: str, rates: tuple[float, float]) -> pd.Series:
    """Predicted seconds of each phase row of ``proj`` (clock.phase_projection's rows) at ``rates``."""
    full, low = (r * 1e9 for r in rates)
    explore = (proj["precision"].astype(str) == "explore").to_numpy()
    flops = proj["flops"].to_numpy(float)
    if profile == "gemm":
        share = np.where(explore, proj["quantized_share"].to_numpy(float), 0.0)
        per_flop = share / low + (1.0 - share) / full
    else:
        per_flop = np.where(explore, 1.0 / low, 1.0 / full)
    return pd.Series(flops * per_flop, index=proj.index)


@report_kind("cpu_prediction", title="Table 5 on this CPU: predicted from its measured rates", order=21)
def cpu_prediction(tables: Tables):
    """The section: the prediction table on CPU runs that measured their rates; nothing elsewhere."""
    table = cpu_prediction_table(tables)
    return [] if table is None else [table]


def cpu_prediction_table(tables: Tables) -> Table | None:
    """Predicted against measured rollout and E2E speedup of every timed arm over the baseline, on this CPU."""
    from solbench.report.clock import phase_projection
    from solbench.report.timing import cpu_label, per_run_medians, quiet_runs

    if "cpu" not in tables.device_kinds():
        return None
    rates = cpu_rates(tables)
    proj = phase_projection(tables)
    if not rates or proj.empty:
        return None
    med = per_run_medians(tables)[0]
    quiet, _ = quiet_runs(tables, med)
    med = med[med["run_id"].isin(quiet)]
    opts = tables.options
    from solbench.report.tables import same_method

    bases = [a for a in tables.arm_order(tables.done_runs)
             if a in set(med.loc[med["method"].map(lambda m: same_method(m, opts.baseline_method)), "arm"])]
    if not bases:
        return None
    base = bases[0]
    predicted = {}
    for profile, r in rates.items():
        p = proj.assign(pred_s=predicted_seconds(proj, profile, r))
        rollout = p[p["phase"].isin(tables.rollout_phases())].groupby(["run_id", "step"])["pred_s"].sum().groupby("run_id").median()
        e2e = p[~p["phase"].isin(EVAL_PHASES)].groupby(["run_id", "step"])["pred_s"].sum().groupby("run_id").median()
        predicted[profile] = (rollout, e2e)
    rows = []
    arms = [a for a in tables.arm_order(tables.done_runs) if a in set(med["arm"]) and a != base]
    for arm in arms:
        for kind, col, index in (("rollout", "rollout_s", 0), ("E2E", "e2e_s", 1)):
            b, t = med[med["arm"] == base], med[med["arm"] == arm]
            measured = float(b[col].mean() / t[col].mean()) if len(b) and len(t) else np.nan
            # the spec's speed block timed the arm alone (solbench.report.speed_block): the prediction is checked on it
            from solbench.report.speed_block import block_ratio_of

            alone = block_ratio_of(tables, tables.done_runs[tables.done_runs["arm"] == arm], kind)
            row = {"arm": arm, "baseline": base, "kind": kind, "measured": measured, "measured_alone": alone}
            reference = alone if np.isfinite(alone) else measured
            for profile, series in predicted.items():
                pb = series[index].reindex(b["run_id"]).dropna()
                pt = series[index].reindex(t["run_id"]).dropna()
                value = float(pb.mean() / pt.mean()) if len(pb) and len(pt) and pt.mean() > 0 else np.nan
                row[f"predicted_{profile}"] = value
                row[f"error_{profile}"] = value / reference - 1.0 if np.isfinite(value) and reference > 0 else np.nan
            rows.append(row)
    if not rows:
        return None
    data = pd.DataFrame(rows)
    display = pd.DataFrame({"method": data["arm"], "over": data["baseline"], "ratio": data["kind"],
                            "measured": data["measured"].map(lambda v: f"{v:.2f}x" if np.isfinite(v) else "-")})
    if data["measured_alone"].notna().any():  # errors below are against it
        display["measured alone (speed block)"] = data["measured_alone"].map(lambda v: f"{v:.2f}x" if np.isfinite(v)
                                                                             else "-")
    for profile in predicted:
        display[f"predicted ({profile} rates)"] = [
            f"{v:.2f}x ({e:+.0%}{'' if abs(e) <= TOLERANCE else ', off'})" if np.isfinite(v) and np.isfinite(e) else "-"
            for v, e in zip(data[f"predicted_{profile}"], data[f"error_{profile}"])]
    rate_text = "; ".join(f"{profile}: full precision {fmt_num(r[0], 3)}, explore {fmt_num(r[1], 3)} GFLOP/s"
                          for profile, r in rates.items())
    return Table("cpu_prediction", f"Table 5 on {cpu_label(tables)}: predicted from the CPU's measured rates against "
                 "the clock", data, (
                     f"Each run measured this CPU's rates at its shapes when it started (cpu_rates.json; medians: "
                     f"{rate_text}). The predicted ratio prices the runs' counted FLOPs per phase with them (module "
                     "solbench.report.cpu_check: GEMM rates as a FLOP-count projection does, forward rates with a "
                     "whole forward's other work); the measured ratio is the clock's (quiet runs, median seconds per "
                     f"iteration, mean over seeds); where the spec's speed block timed the arm alone (column 'measured alone', "
                     "paired within rounds), the error is against that ratio. In brackets the prediction's error; 'off' "
                     f"beyond {TOLERANCE:.0%}. "
                     "Phases without a FLOP count (selection, rewards) are in the measured E2E time and not in the "
                     "prediction."), display=display)
