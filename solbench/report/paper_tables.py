"""The paper's tables in the paper's shape, for the report's first page, from the numbers the report kinds computed.

Each function takes the tidy frame a report kind wrote (its CSV) and returns a compact display frame, arms named by
their short labels (solbench/report/labels.py), intervals kept as "mean ±half-width" or "[lo, hi]":

- Table 1 (main_results_<model>.csv): one row per method (its main arm) and the base model, one column per reward
  score: the score, its t interval over run seeds, and Δ against the base (the run's own step 0);
- Table 5 (timing_table5.csv): the paper's columns, rollout and end to end for naive BF16 scaling and Sol-RL with
  each speedup, one row per model (Sol-RL's main arm), then the paper's own rows (8x B200) for comparison;
- Tables 2 and 3 (ablations_<model>_sol_rl.csv): one row per explore-step count (Table 2) or candidate pool N at
  fixed K (Table 3), the arms the findings compare;
- Table 8 (ranking_fidelity.csv): Spearman ρ, Kendall τ and hit@K of every fidelity arm and reward (all seeds).
"""

from __future__ import annotations

import math

import pandas as pd

from solbench.report.findings_common import axis_arms, main_arm
from solbench.report.tables import Tables, _fmt_setting


def _interval(mean, lo, hi, digits: int, bracket: bool, suffix: str = "") -> str:
    """'0.427 ±0.088' (a symmetric t interval by its half-width) or, with ``bracket``, '0.427 [0.339, 0.515]'; the
    mean alone without an interval, '-' without a mean."""
    try:
        mean, lo, hi = float(mean), float(lo), float(hi)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(mean):
        return "-"
    text = f"{mean:.{digits}f}{suffix}"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return text
    if bracket:
        return f"{text} [{lo:.{digits}f}{suffix}, {hi:.{digits}f}{suffix}]"
    return f"{text} ±{(hi - lo) / 2:.{digits}f}"


def _pm(mean, lo, hi, digits: int = 3) -> str:
    return _interval(mean, lo, hi, digits, bracket=False)


def _bracket(mean, lo, hi, suffix: str = "") -> str:
    return _interval(mean, lo, hi, 2 if suffix else 3, bracket=True, suffix=suffix)


def table1(tables: Tables, tidy: pd.DataFrame, labels: dict[str, str], model: str) -> pd.DataFrame:
    """Table 1 of one model (module docstring)."""
    if tidy is None or tidy.empty or "metric" not in tidy:
        return pd.DataFrame()
    runs = tables.done_runs[tables.done_runs["model"] == model]
    mains = {main_arm(tables, runs, m) for m in runs["method"].dropna().unique()}
    base = [a for a in tidy["arm"].unique() if str(a).startswith("Base")]
    keep = [a for a in dict.fromkeys(tidy["arm"]) if a in mains or a in base]
    rows = []
    for arm in keep:
        mine = tidy[tidy["arm"] == arm]
        row = {"method": labels.get(arm, arm), "seeds": int(mine["n_seeds"].max()) if "n_seeds" in mine else "-"}
        for _, r in mine.iterrows():
            cell = _pm(r["mean"], r.get("ci_lo"), r.get("ci_hi"))
            delta = r.get("delta_mean")
            if delta is not None and isinstance(delta, float) and math.isfinite(delta):
                lo, hi = r.get("delta_lo"), r.get("delta_hi")
                half = f" ±{(hi - lo) / 2:.3f}" if lo is not None and math.isfinite(lo) and math.isfinite(hi) else ""
                cell += f" (Δ {delta:+.3f}{half})"
            row[str(r["metric"])] = cell
        rows.append(row)
    return pd.DataFrame(rows)


def table5(tables: Tables, tidy: pd.DataFrame, labels: dict[str, str]) -> pd.DataFrame:
    """Table 5 in the paper's columns (module docstring)."""
    needed = {"model", "baseline", "target", "rollout_baseline_s", "rollout_target_s", "e2e_baseline_s", "e2e_target_s"}
    if tidy is None or tidy.empty or not needed <= set(tidy.columns):
        return pd.DataFrame()
    rows = []
    for model, mine in tidy.groupby("model", sort=False):
        runs = tables.done_runs[tables.done_runs["model"] == model]
        target = main_arm(tables, runs, tables.options.target_method)
        pick = mine[mine["target"] == target]
        r = (pick if len(pick) else mine).iloc[0]
        rows.append({
            "model": model, "Sol-RL arm": labels.get(r["target"], r["target"]),
            "rollout naive (s)": _pm(r["rollout_baseline_s"], r.get("rollout_baseline_lo"), r.get("rollout_baseline_hi"), 2),
            "rollout Sol-RL (s)": _pm(r["rollout_target_s"], r.get("rollout_target_lo"), r.get("rollout_target_hi"), 2),
            "rollout speedup": _bracket(r.get("rollout_speedup"), r.get("rollout_speedup_lo"),
                                        r.get("rollout_speedup_hi"), "x"),
            "E2E naive (s)": _pm(r["e2e_baseline_s"], r.get("e2e_baseline_lo"), r.get("e2e_baseline_hi"), 2),
            "E2E Sol-RL (s)": _pm(r["e2e_target_s"], r.get("e2e_target_lo"), r.get("e2e_target_hi"), 2),
            "E2E speedup": _bracket(r.get("e2e_speedup"), r.get("e2e_speedup_lo"), r.get("e2e_speedup_hi"),
                                    "x")})
    from solbench.report.cost import PAPER_TABLE5

    for _, p in PAPER_TABLE5.iterrows():  # the paper's own rows, for comparison (GPU clocks, no intervals)
        rows.append({"model": f"{p['label']} (paper)", "Sol-RL arm": "Sol-RL, 8x B200",
                     "rollout naive (s)": f"{p['rollout_naive']:g}", "rollout Sol-RL (s)": f"{p['rollout_sol']:g}",
                     "rollout speedup": f"{p['rollout_naive'] / p['rollout_sol']:.2f}x",
                     "E2E naive (s)": f"{p['e2e_naive']:g}", "E2E Sol-RL (s)": f"{p['e2e_sol']:g}",
                     "E2E speedup": f"{p['e2e_naive'] / p['e2e_sol']:.2f}x"})
    return pd.DataFrame(rows)


#: (paper table, method_config axis, the ablation table's column of it)
ABLATION_AXES = (("Table 2", "explore_steps", "explore steps"), ("Table 3", "n", "candidates N"))


def ablation_table(tables: Tables, tidy: pd.DataFrame, labels: dict[str, str], model: str, axis: str,
                   column: str) -> pd.DataFrame:
    """Table 2 or 3 of one model: one row per value of ``axis`` (the arms the findings compare), every reward."""
    if tidy is None or tidy.empty or "arm" not in tidy:
        return pd.DataFrame()
    runs = tables.done_runs[tables.done_runs["model"] == model]
    arms = axis_arms(tables, runs, tables.options.target_method, axis)
    if len(arms) < 2:
        return pd.DataFrame()
    metrics = [c[: -len("_mean")] for c in tidy.columns if c.endswith("_mean") and not c.startswith("vs_default")]
    rows = []
    for value, arm in arms.items():
        mine = tidy[tidy["arm"] == arm]
        if mine.empty:
            continue
        r = mine.iloc[0]
        row = {column: _fmt_setting(value), "arm": labels.get(arm, arm),
               "seeds": int(r["n_seeds"]) if "n_seeds" in r and pd.notna(r["n_seeds"]) else "-",
               "read at step": _fmt_setting(r.get("read at step", "-"))}
        for m in metrics:
            row[m] = _pm(r[f"{m}_mean"], r.get(f"{m}_lo"), r.get(f"{m}_hi"))
        rows.append(row)
    return pd.DataFrame(rows)


def table8(tidy: pd.DataFrame, labels: dict[str, str], top_k=(4, 8, 12)) -> pd.DataFrame:
    """Table 8: ρ, τ and hit@K of every fidelity arm and reward, all seeds (module docstring)."""
    if tidy is None or tidy.empty or "spearman_rho_mean" not in tidy:
        return pd.DataFrame()
    rows = tidy[tidy["kind"] == "all seeds"] if "kind" in tidy else tidy
    out = []
    for _, r in rows.iterrows():
        row = {"fidelity arm": labels.get(r["arm"], r["arm"]), "reward": r.get("reward_name", "-"),
               "prompts": int(r["n_groups"]) if pd.notna(r.get("n_groups")) else "-",
               "Spearman ρ": _bracket(r["spearman_rho_mean"], r.get("spearman_rho_lo"), r.get("spearman_rho_hi")),
               "Kendall τ": _bracket(r.get("kendall_tau_mean"), r.get("kendall_tau_lo"), r.get("kendall_tau_hi"))}
        for k in top_k:
            if f"hit@{k}_mean" in r and pd.notna(r[f"hit@{k}_mean"]):
                chance = r.get(f"hit@{k}_chance")
                row[f"hit@{k}"] = f"{float(r[f'hit@{k}_mean']):.2f}" + (
                    f" ({float(chance):.2f})" if chance is not None and pd.notna(chance) else "")
        out.append(row)
    return pd.DataFrame(out)
