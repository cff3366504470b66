"""Paired comparisons at equal (PROJECTED) GPU time: the paper's Table 1 compares methods at equal GPU-hours.

Two runs of the same seed (same eval prompts and eval noise) are compared at the clock budget both reached:
B = the smaller of their clocks at their last evaluation. Each run's per-sample eval scores (split
``eval_sample``) are read at B, linearly interpolated between the two evaluations whose clock values
bracket B (a run that reaches B exactly at an evaluation uses it as it is). The per-prompt differences of
the seeds then go through the same crossed-design interval as every paired comparison
(``stats.crossed_interval``). The clock is the PROJECTED GPU clock (solbench/report/clock.py): the
measured one of CPU runs, where FP4 is emulated, cannot speak to GPU time.

Issue 54: the same comparison at the MEASURED clock (the runs' own wall clock) and at the projected clock with the
low-precision rate at 2x, 3x and 4x BF16 (``RATES``: how much of the projected result rests on the profile's FP4
rate), against every other method, in one table (``table1_equal_time``): the primary's comparison (Sol-RL against
DiffusionNFT) beside every arm that beats Sol-RL at equal projected time. A declared read-out iteration caps every
run's clock at its evaluation there.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from solbench.report.clock import clock_at
from solbench.report.paired import Paired, sample_rows, seed_runs
from solbench.report.stats import paired_ci
from solbench.report.tables import Tables


MEASURED = "measured"  # the clock= of the runs' own wall clock (the eval rows' wall_s)


def _rate_clock(tables: Tables, rate: float) -> pd.DataFrame:
    """run_id, step, projected_s: the projected clock with the low-precision rate at ``rate`` x the BF16 peak (the
    hardware profile's BF16 peak and utilisation otherwise), cumulative over iterations (step 0 = 0)."""
    from solbench.report.clock import hardware, phase_projection

    cache = tables.__dict__.setdefault("_rate_clock", {})
    key = (rate, tables.options.hardware, tables.options.mfu, len(tables.timings))
    if key not in cache:
        rows = phase_projection(tables)
        bf16 = hardware(tables).bf16 * 1e15
        share = rows["quantized_share"].to_numpy(float)
        seconds = rows["flops"].to_numpy(float) * (share / (rate * bf16) + (1.0 - share) / bf16) / tables.options.mfu
        per = rows.assign(projected_s=seconds).groupby(["run_id", "step"])["projected_s"].sum().reset_index()
        per = per.sort_values(["run_id", "step"])
        per["projected_s"] = per.groupby("run_id")["projected_s"].cumsum()
        starts = pd.DataFrame({"run_id": per["run_id"].unique(), "step": 0, "projected_s": 0.0})
        cache[key] = pd.concat([starts, per], ignore_index=True).sort_values(["run_id", "step"])
    return cache[key]


def _eval_clock(tables: Tables, run_id: str, metric: str, clock=None) -> pd.Series:
    """The clock (s) at each evaluation step of one run, by step: the projected one (``clock`` None), the measured
    one (``MEASURED``: the eval rows' wall_s), or the projected one at a low-precision rate of ``clock`` x BF16."""
    m = tables.metrics
    rows = m[(m["run_id"] == run_id) & (m["split"] == "eval") & (m["metric"] == metric)][["run_id", "step"]]
    rows = rows.drop_duplicates("step").sort_values("step")
    if tables.options.readout_iteration is not None:  # the budget never reaches past the declared read-out
        rows = rows[rows["step"] <= tables.options.readout_iteration]
    if rows.empty:
        return pd.Series(dtype=float)
    steps = rows["step"].astype(int).to_numpy()
    if clock == MEASURED:
        wall = m[(m["run_id"] == run_id) & (m["split"] == "eval") & (m["metric"] == metric)]
        return wall.drop_duplicates("step").set_index("step")["wall_s"].reindex(steps).astype(float)
    if clock is not None:
        c = _rate_clock(tables, float(clock))
        c = c[c["run_id"] == run_id]
        if c.empty:
            return pd.Series(np.nan, index=steps)
        pos = np.searchsorted(c["step"].to_numpy(float), steps, side="right") - 1
        values = c["projected_s"].to_numpy(float)
        return pd.Series(np.where(pos >= 0, values[np.clip(pos, 0, None)], np.nan), index=steps)
    return pd.Series(clock_at(tables, rows).to_numpy(float), index=steps)


def scores_at(samples: pd.DataFrame, run_id: str, clock: pd.Series, budget: float) -> pd.Series:
    """Per (prompt_id, eval_seed): the run's eval score at clock ``budget``, linear between evaluations."""
    clock = clock.dropna()
    if clock.empty or budget > clock.iloc[-1] + 1e-12 * max(1.0, abs(budget)):
        return pd.Series(dtype=float)
    after = int(np.searchsorted(clock.to_numpy(), budget, side="left"))
    s = samples[samples["run_id"] == run_id]
    hi_step = int(clock.index[after])
    hi = s[s["step"] == hi_step].groupby(["prompt_id", "eval_seed"])["value"].mean()
    if after == 0 or np.isclose(clock.iloc[after], budget, rtol=1e-12, atol=0.0):
        return hi
    lo_step = int(clock.index[after - 1])
    lo = s[s["step"] == lo_step].groupby(["prompt_id", "eval_seed"])["value"].mean()
    w = (budget - clock.iloc[after - 1]) / (clock.iloc[after] - clock.iloc[after - 1])
    both = pd.concat([lo.rename("lo"), hi.rename("hi")], axis=1, join="inner")
    return both["lo"] + w * (both["hi"] - both["lo"])


def paired_equal_time(tables: Tables, model: str, metric: str, arm: str, base_arm: str,
                      clock=None) -> tuple[Paired, list] | None:
    """arm - base_arm at the clock both runs of each seed pair reached (``_eval_clock``'s ``clock``: the projected one
    by default); (Paired, per-seed budgets)."""
    a_runs, b_runs = seed_runs(tables, model, arm), seed_runs(tables, model, base_arm)
    samples = sample_rows(tables, metric)
    if samples.empty:
        return None
    rows, seeds, budgets, a_vals, b_vals = [], [], [], [], []
    for seed in sorted(set(a_runs) & set(b_runs), key=lambda s: (str(type(s)), s)):
        ca, cb = _eval_clock(tables, a_runs[seed], metric, clock), _eval_clock(tables, b_runs[seed], metric, clock)
        if ca.dropna().empty or cb.dropna().empty:
            continue
        budget = float(min(ca.dropna().iloc[-1], cb.dropna().iloc[-1]))
        sa, sb = scores_at(samples, a_runs[seed], ca, budget), scores_at(samples, b_runs[seed], cb, budget)
        both = pd.concat([sa.rename("a"), sb.rename("b")], axis=1, join="inner")
        if both.empty:
            continue
        rows.append((both["a"] - both["b"]).groupby(level="prompt_id").mean())
        seeds.append(seed)
        budgets.append(budget)
        a_vals.append(float(both["a"].mean()))
        b_vals.append(float(both["b"].mean()))
    if not rows:
        return None
    matrix = pd.concat(rows, axis=1, join="inner").T.to_numpy(float)
    ci = paired_ci(matrix, level=tables.options.ci_level)
    return Paired(ci, None, float(np.mean(a_vals)), float(np.mean(b_vals)), seeds), budgets


#: low-precision rates (x the BF16 peak) of the projected comparison's sensitivity (B200: NVFP4 at 4x BF16)
RATES = (2.0, 3.0, 4.0)


def table1_equal_time(tables: Tables):
    """Per model: Sol-RL minus each other method's main arm (and every arm that beats Sol-RL at equal projected time)
    on the training reward, at equal projected time, at equal measured time and at the projected clock with NVFP4 at
    2x, 3x and 4x BF16."""
    from solbench.report.findings_common import main_arm, reward_roles
    from solbench.report.paired import fmt_paired
    from solbench.report.registry import Note, Table
    from solbench.report.stats import verdict

    tidy, display = [], []
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        sol = main_arm(tables, runs, "sol_rl")
        roles = reward_roles(tables, runs)
        if sol is None or not roles:
            continue
        metric = roles[0][0]
        nft = main_arm(tables, runs, "diffusion_nft")
        mains = {main_arm(tables, runs, m) for m in runs["method"].unique()} - {sol, None}
        for arm in [a for a in tables.arm_order(runs) if a != sol]:
            clocks = {"projected": None, "measured": MEASURED, **{f"{r:g}x": r for r in RATES}}
            got = {}
            for name, clock in clocks.items():
                eq = paired_equal_time(tables, model, metric, sol, arm, clock)
                got[name] = eq[0].ci if eq is not None else None
            primary = got["projected"]
            beats = primary is not None and verdict(primary.lo, primary.hi, 0.0, "less") == "reproduced"
            if arm not in mains and not beats:
                continue
            row = dict(model=model, arm=arm, sol_rl=sol, metric=metric, primary_comparison=arm == nft,
                       beats_sol_rl_projected=beats)
            cells = {"against": arm + (" (the primary's comparison)" if arm == nft else "")
                     + (" **beats Sol-RL**" if beats else "")}
            for name, ci in got.items():
                row.update({f"{name}_effect": ci.mean if ci else np.nan, f"{name}_lo": ci.lo if ci else np.nan,
                            f"{name}_hi": ci.hi if ci else np.nan})
                label = {"projected": "equal PROJECTED time", "measured": "equal MEASURED time"}.get(
                    name, f"projected, NVFP4 at {name} BF16")
                cells[label] = fmt_paired(ci.mean, ci.lo, ci.hi, ci.covers) if ci else "-"
            tidy.append(row)
            display.append(cells)
    if not tidy:
        return Note("Table 1 at equal time", "Needs Sol-RL and other arms with common run seeds and FLOP counts.")
    return Table("table1_equal_time", "Table 1 at equal time: measured, projected, and the projection's FP4 rate",
                 pd.DataFrame(tidy), (
        "Sol-RL (its main arm) minus each arm on the training reward, paired by run seed at the clock both runs reached "
        "(per-sample scores interpolated between evaluations; seeds crossed with prompts): at equal PROJECTED GPU time "
        "(the primary's clock: counted FLOPs at the hardware profile's rates), at equal MEASURED time (these runs' own "
        "wall clock, this machine), and at the projected clock with the low-precision rate at 2x, 3x and 4x the BF16 "
        "peak (B200's NVFP4 is 4x): how much of the projected result rests on the FP4 rate. Rows: every other "
        "method's main arm, and every arm whose interval at equal projected time lies wholly below 0 (it beats "
        "Sol-RL)."), display=pd.DataFrame(display))
