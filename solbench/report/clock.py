"""The PROJECTED GPU clock: what a run's counted FLOPs would take on a hardware profile.

Every timing row carries the FLOPs its phase counted (``timings.flops``; solbench/flops.py). The projected
clock of a run at step s is the sum, over its training iterations 1..s and their phases with a count
(evaluation excluded), of flops / (peak of the phase's precision x mfu): explore-precision phases at the
profile's low-precision peak (NVFP4 on B200, FP8 on H100), every other phase at its BF16 peak
(``solbench.report.cost.HARDWARE``, options ``hardware`` and ``mfu``). It is a PROJECTION, never a
measurement: it lets a CPU run (where FP4 is emulated and slower than full precision) show the shape
the paper's wall-clock claims would have on FP4 hardware. Phases without a FLOP count (e.g. select,
reward, or training when the methods do not count it) add nothing; ``counted_phases`` says which did.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.tables import EVAL_PHASES, Tables

PROJECTION = "PROJECTION"


def hardware(tables: Tables):
    from solbench.report.cost import get_hardware

    return get_hardware(tables.options.hardware)


def phase_projection(tables: Tables) -> pd.DataFrame:
    """Training timing rows of done runs with a FLOP count: run_id, step, phase, precision, flops, projected_s."""
    t = tables.timings
    cols = ["run_id", "step", "phase", "precision", "flops", "projected_s"]
    if "flops" not in t:
        return pd.DataFrame(columns=cols)
    t = t[t["run_id"].isin(tables.done_runs["run_id"]) & ~t["phase"].isin(EVAL_PHASES)].copy()
    t["flops"] = pd.to_numeric(t["flops"], errors="coerce")
    t = t.dropna(subset=["flops", "step"])
    if t.empty:
        return pd.DataFrame(columns=cols)
    hw = hardware(tables)
    low_peak, _ = hw.explore_peak()
    mfu = tables.options.mfu
    peak = np.where(t["precision"].astype(str) == "explore", low_peak, hw.bf16) * 1e15 * mfu
    t["projected_s"] = t["flops"].to_numpy(float) / peak
    return t[cols].reset_index(drop=True)


def projected_clock(tables: Tables) -> pd.DataFrame:
    """run_id, step, projected_s: cumulative PROJECTED seconds of iterations 1..step (step 0 = 0)."""
    rows = phase_projection(tables)
    if rows.empty:
        return pd.DataFrame(columns=["run_id", "step", "projected_s"])
    per_iter = rows.groupby(["run_id", "step"])["projected_s"].sum().reset_index().sort_values(["run_id", "step"])
    per_iter["projected_s"] = per_iter.groupby("run_id")["projected_s"].cumsum()
    starts = pd.DataFrame({"run_id": per_iter["run_id"].unique(), "step": 0, "projected_s": 0.0})
    return pd.concat([starts, per_iter], ignore_index=True).sort_values(["run_id", "step"]).reset_index(drop=True)


def clock_at(tables: Tables, frame: pd.DataFrame) -> pd.Series:
    """The projected clock of each (run_id, step) row of ``frame``: the cumulative value of the last
    iteration at or before the step (NaN for runs with no counted FLOPs)."""
    clock = projected_clock(tables)
    out = pd.Series(np.nan, index=frame.index, dtype=float)
    for run_id, idx in frame.groupby("run_id").groups.items():
        c = clock[clock["run_id"] == run_id]
        if c.empty:
            continue
        steps = frame.loc[idx, "step"].to_numpy(float)
        pos = np.searchsorted(c["step"].to_numpy(float), steps, side="right") - 1
        values = c["projected_s"].to_numpy(float)
        out.loc[idx] = np.where(pos >= 0, values[np.clip(pos, 0, None)], np.nan)
    return out


def counted_phases(tables: Tables) -> tuple[list[str], list[str]]:
    """(training phases with a FLOP count, training phases timed without one)."""
    t = tables.timings
    t = t[t["run_id"].isin(tables.done_runs["run_id"]) & ~t["phase"].isin(EVAL_PHASES)]
    if t.empty:
        return [], []
    flops = pd.to_numeric(t["flops"], errors="coerce") if "flops" in t else pd.Series(np.nan, index=t.index)
    counted = sorted(set(t.loc[flops.notna(), "phase"]))
    uncounted = sorted(set(t.loc[flops.isna(), "phase"]) - set(counted))
    return counted, uncounted


def describe(tables: Tables) -> str:
    """One sentence for captions: the hardware, peaks, utilisation and which phases are counted."""
    hw = hardware(tables)
    low_peak, low_name = hw.explore_peak()
    counted, uncounted = counted_phases(tables)
    text = (f"{PROJECTION}: the run's counted FLOPs per phase at the {hw.name} rate of the precision each phase ran "
            f"at (explore in {low_name}, {low_peak:g} PFLOP/s; full precision BF16, {hw.bf16:g} PFLOP/s) x "
            f"{tables.options.mfu:.0%} utilisation, summed over training iterations; not a measurement. Phases "
            f"counted: {', '.join(counted) or 'none'}")
    if uncounted:
        text += f"; timed but without a FLOP count, so left out: {', '.join(uncounted)}"
    return text + "."
