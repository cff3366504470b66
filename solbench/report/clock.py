"""The PROJECTED GPU clock: what a run's counted FLOPs would take on a hardware profile.

Every timing row carries the FLOPs its phase counted (``timings.flops``; solbench/models/flops.py). The projected
clock of a run at step s is the sum, over its training iterations 1..s and their phases with a count
(evaluation excluded), of flops / (peak x mfu). Full-precision phases run at the profile's BF16 peak.
Explore-precision phases run at the precision each FLOP really ran at: the share q of a forward's FLOPs
that the run's recipe quantizes (recorded with the results, ``fact_quantized_share``: solbench.models.shares of
the run's model, resolution and ``quant.recipe``, the rule ``quantized_copy`` applies) at the low-precision peak
(NVFP4 on B200, FP8 on H100), the rest (attention products, the layers the recipe keeps) at BF16
(``solbench.report.hardware.HARDWARE``, options ``hardware`` and ``mfu``). It is a PROJECTION, never a
measurement: it lets a CPU run (where FP4 is emulated and slower than full precision) show the shape
the paper's wall-clock claims would have on FP4 hardware. Phases without a FLOP count (e.g. select,
reward, or training when the methods do not count it) add nothing; ``counted_phases`` says which did. A run
that explored but whose share is not recorded (results collected before it was) has no projected clock, and
``describe`` names the command that records it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.hardware import get_hardware
from solbench.report.registry import Note, Table
from solbench.report.stats import fmt_num
from solbench.report.stored import collect_command, run_fact
from solbench.report.tables import EVAL_PHASES, Tables

PROJECTION = "PROJECTION"


def hardware(tables: Tables):
    return get_hardware(tables.options.hardware)


def projected_seconds(flops, explore, share, hw, mfu: float) -> np.ndarray:
    """PROJECTED seconds of FLOP counts on one GPU of ``hw`` at utilisation ``mfu``: full-precision rows at
    the BF16 peak; ``explore`` rows with ``share`` of their FLOPs at the low-precision peak and the rest at
    BF16. Arrays (or scalars) broadcast together."""
    flops = np.asarray(flops, dtype=float)
    share = np.where(np.asarray(explore, dtype=bool), np.asarray(share, dtype=float), 0.0)
    low_peak, _ = hw.explore_peak()
    per_flop = share / (low_peak * 1e15) + (1.0 - share) / (hw.bf16 * 1e15)
    return flops * per_flop / mfu


def run_shares(runs: pd.DataFrame) -> pd.Series:
    """Per run_id: the share of an explore forward's FLOPs its recipe quantizes (on TransformerEngine's
    backend, the hardware projected onto, at the run's model, resolution and text length), as recorded with the
    results (``fact_quantized_share``); NaN where it is not."""
    values = pd.to_numeric(run_fact(runs, "fact_quantized_share"), errors="coerce").to_numpy(float)
    return pd.Series(values, index=runs["run_id"].astype(str).to_numpy(), dtype=float)


def phase_projection(tables: Tables) -> pd.DataFrame:
    """Training timing rows of done runs with a FLOP count: run_id, step, phase, precision, flops,
    quantized_share (of explore rows; 0 otherwise), projected_s. Computed once per Tables and options."""
    return _projection(tables)[0]


def unpriced_runs(tables: Tables) -> list[str]:
    """Done runs with counted explore FLOPs but no recorded quantized share: left out of the projection."""
    return _projection(tables)[1]


def _projection(tables: Tables) -> tuple[pd.DataFrame, list[str]]:
    key = (tables.options.hardware, tables.options.mfu, len(tables.timings), len(tables.done_runs))
    cache = tables.__dict__.setdefault("_phase_projection", {})
    if key not in cache:
        cache[key] = _phase_projection(tables)
    return cache[key]


def _phase_projection(tables: Tables) -> tuple[pd.DataFrame, list[str]]:
    t = tables.timings
    cols = ["run_id", "step", "phase", "precision", "flops", "quantized_share", "projected_s"]
    if "flops" not in t:
        return pd.DataFrame(columns=cols), []
    t = t[t["run_id"].isin(tables.done_runs["run_id"]) & ~t["phase"].isin(EVAL_PHASES)].copy()
    t["flops"] = pd.to_numeric(t["flops"], errors="coerce")
    t = t.dropna(subset=["flops", "step"])
    if t.empty:
        return pd.DataFrame(columns=cols), []
    explore = (t["precision"].astype(str) == "explore").to_numpy()
    runs = tables.done_runs[tables.done_runs["run_id"].isin(t.loc[explore, "run_id"])]
    shares = run_shares(runs.drop_duplicates("run_id")) if len(runs) else pd.Series(dtype=float)
    t["quantized_share"] = np.where(explore, t["run_id"].map(shares).to_numpy(float), 0.0)
    unpriced = sorted(set(t.loc[explore & t["quantized_share"].isna().to_numpy(), "run_id"]))
    t = t[~t["run_id"].isin(unpriced)]
    explore = (t["precision"].astype(str) == "explore").to_numpy()
    t["projected_s"] = projected_seconds(t["flops"], explore, t["quantized_share"], hardware(tables),
                                         tables.options.mfu)
    return t[cols].reset_index(drop=True), unpriced


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
    proj = phase_projection(tables)
    shares = proj.loc[proj["precision"].astype(str) == "explore"].groupby("run_id")["quantized_share"].first()
    share_text = ""
    if len(shares):
        lo, hi = f"{float(shares.min()):.0%}", f"{float(shares.max()):.0%}"  # a range only where it prints as one
        share_text = (f" (explore phases: only the {lo}" + (f"-{hi}" if hi != lo else "")
                      + f" of a forward's FLOPs the run's recipe quantizes at {low_name}, the rest at BF16)")
    text = (f"{PROJECTION}: the run's counted FLOPs per phase at the {hw.name} rate of the precision each FLOP ran "
            f"at{share_text}: {low_name} {low_peak:g} PFLOP/s, BF16 {hw.bf16:g} PFLOP/s, x "
            f"{tables.options.mfu:.0%} utilisation, summed over training iterations; not a measurement. Phases "
            f"counted: {', '.join(counted) or 'none'}")
    if uncounted:
        text += f"; timed but without a FLOP count, so left out: {', '.join(uncounted)}"
    return text + "." + unpriced_text(tables)


def unpriced_text(tables: Tables) -> str:
    """' N run(s) have no projected clock: ...' for runs whose explore share is not recorded ('' when none)."""
    unpriced = unpriced_runs(tables)
    if not unpriced:
        return ""
    return (f" {len(unpriced)} run(s) that explored have no projected clock: the collected tables lack the share "
            f"of their explore forward the recipe quantizes ({', '.join(unpriced)}); {collect_command()} records it.")


def own_flops_projection(tables: Tables, hw) -> Table | Note | None:
    """This experiment's own runs: the FLOPs they recorded per iteration, projected onto ``hw``."""
    t = tables.timings
    if "flops" not in t or t["flops"].isna().all():
        return Note("Projection of these runs", "The timings carry no FLOP counts (flops column empty): "
                    "no projection of this experiment's own runs onto GPU hardware.")
    runs = tables.done_runs
    t = phase_projection(tables)
    if t.empty:
        return Note("Projection of these runs", unpriced_text(tables).strip()) if unpriced_runs(tables) else None
    low_peak, low_name = hw.explore_peak()
    mfu = tables.options.mfu
    per_iter = t.groupby(["run_id", "step"]).agg(flops=("flops", "sum"), projected_s=("projected_s", "sum")).reset_index()
    per_run = per_iter.groupby("run_id")[["flops", "projected_s"]].median().reset_index().merge(
        runs[["run_id", "model", "arm"]], on="run_id")
    arms = per_run.groupby(["model", "arm"])[["flops", "projected_s"]].mean().reset_index()
    arms = arms.set_index("arm").reindex([a for a in tables.arm_order(runs) if a in set(arms["arm"])]).reset_index()
    display = pd.DataFrame({"model": arms["model"], "method": arms["arm"],
                            "counted GFLOP / iteration": arms["flops"].map(lambda v: fmt_num(v / 1e9, 3)),
                            f"PROJECTED µs / iteration on one {hw.name}": arms["projected_s"].map(lambda v: fmt_num(v * 1e6, 3))})
    return Table("cost_projection_runs", f"PROJECTED time of these runs' counted FLOPs on one {hw.name}", arms, (
        "PROJECTION, not a measurement: the transformer FLOPs each run counted per training iteration (median over "
        f"iterations, mean over seeds), divided by the {hw.name} peak of the precision each FLOP ran at (explore "
        f"phases: the share of a forward the run's recipe quantizes at {low_name} {low_peak} PFLOP/s, the rest and "
        f"every full-precision phase at BF16 {hw.bf16} PFLOP/s) at {mfu:.0%} utilisation. Only the counted "
        "phases are included; tiny models cannot fill a GPU, so this is a lower bound, for scale only."
        + unpriced_text(tables)),
        display=display)
