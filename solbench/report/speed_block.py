"""The speed block in the report: Table 5 timed alone on the machine (solbench.speed), read from speed.parquet.

``block_ratios`` gives, per arm and sampling variant of the latest block, the paired ratio over rounds against
the baseline arm (solbench.report.speed_stats); ``speed_block`` is the report section: each arm's seconds per iteration,
its paired ratio with the interval over rounds, the rounds accepted and repeated, the load, the CPU or GPU and
the backend, and the ratio of the rounds where the baseline ran first beside those where it did not (the order
effect the rotation cancels).
"""

from __future__ import annotations

import math

import pandas as pd

from solbench.report.registry import Note, Table, report_kind
from solbench.report.stats import fmt_num
from solbench.report.tables import Tables, same_method

SPEED_TABLE = "speed.parquet"


def speed_rows(tables: Tables) -> pd.DataFrame:
    """The latest block's rows (empty where no block ran)."""
    from solbench.report.speed_stats import latest_block

    path = tables.results_dir / SPEED_TABLE
    if not path.exists():
        return pd.DataFrame()
    return latest_block(pd.read_parquet(path))


def baseline_arm(rows: pd.DataFrame, baseline_method: str) -> str | None:
    """The block's arm of the baseline method (naive BF16 scaling), named as its method where several are."""
    arms = rows.drop_duplicates("arm")
    mine = arms[arms["method"].map(lambda m: same_method(str(m), baseline_method))]
    if mine.empty:
        return None
    named = mine[mine["arm"] == mine["method"]]
    return str((named if len(named) else mine)["arm"].iloc[0])


def block_ratios(tables: Tables) -> pd.DataFrame:
    """Per (arm, variant): rounds, the paired rollout and E2E ratios over rounds (geometric mean, t interval, sd of
    the log ratio), and what the arm ran on; empty where no block ran or it has no baseline arm."""
    from solbench.report.speed_stats import paired_ratios, ratio_interval, round_seconds

    rows = speed_rows(tables)
    if rows.empty:
        return pd.DataFrame()
    base = baseline_arm(rows, tables.options.baseline_method)
    if base is None:
        return pd.DataFrame()
    rounds = round_seconds(rows)
    pairs = paired_ratios(rounds, base)
    level = tables.options.ci_level
    info = rows.drop_duplicates(["arm", "variant"]).set_index(["arm", "variant"])
    out = []
    for (arm, variant), g in rounds.groupby(["arm", "variant"], sort=False):
        p = pairs[(pairs["arm"] == arm) & (pairs["variant"] == variant)]
        row = {"arm": arm, "variant": variant, "baseline": base, "method": info.at[(arm, variant), "method"],
               "recipe": info.at[(arm, variant), "recipe"], "backend": info.at[(arm, variant), "backend"],
               "device": info.at[(arm, variant), "device"], "threads": int(info.at[(arm, variant), "threads"]),
               "rounds": int(g["round"].nunique()), "rollout_s": float(g["rollout_s"].median()),
               "e2e_s": float(g["e2e_s"].median()), "load_max": float(g["load"].max())}
        for kind in ("rollout", "e2e"):
            point, lo, hi, sd = ratio_interval(p[f"{kind}_ratio"], level) if len(p) else (math.nan,) * 4
            row.update({f"{kind}_ratio": point, f"{kind}_lo": lo, f"{kind}_hi": hi, f"{kind}_sd": sd})
            first, later = p.loc[p["first"], f"{kind}_ratio"], p.loc[~p["first"], f"{kind}_ratio"]
            row[f"{kind}_ratio_baseline_first"] = ratio_interval(first)[0] if len(first) else math.nan
            row[f"{kind}_ratio_baseline_later"] = ratio_interval(later)[0] if len(later) else math.nan
        out.append(row)
    return pd.DataFrame(out)


def rejected_rounds(rows: pd.DataFrame) -> int:
    """Round attempts written and not accepted (their load passed the bound, or they never finished)."""
    return int(rows.loc[~rows["accepted"].astype(bool), "attempt"].nunique()) if len(rows) else 0


def _fmt(point: float, lo: float, hi: float) -> str:
    if not math.isfinite(point):
        return "-"
    return f"{point:.2f}x" + (f" [{lo:.2f}, {hi:.2f}]" if math.isfinite(lo) else "")


@report_kind("speed_block", title="Table 5 timed alone (the spec's speed block)", order=19)
def speed_block(tables: Tables):
    rows = speed_rows(tables)
    if rows.empty:
        return []
    data = block_ratios(tables)
    if data.empty:
        return [Note("Speed block", f"The speed block has no arm of `{tables.options.baseline_method}` (the baseline) "
                                    "or no accepted round: no paired ratio.", level="warning")]
    level = tables.options.ci_level
    display = pd.DataFrame({
        "arm": data["arm"] + data["variant"].map(lambda v: "" if v == "eager" else f" ({v})"),
        "explore (recipe, backend)": [f"{r}, {b}" if b not in ("-", "") else "- (no explore copy)"
                                      for r, b in zip(data["recipe"], data["backend"])],
        "rounds": data["rounds"].astype(str),
        "rollout (s)": data["rollout_s"].map(lambda v: fmt_num(v, 3)),
        "E2E (s)": data["e2e_s"].map(lambda v: fmt_num(v, 3)),
        "rollout speedup": [_fmt(*v) for v in zip(data["rollout_ratio"], data["rollout_lo"], data["rollout_hi"])],
        "E2E speedup": [_fmt(*v) for v in zip(data["e2e_ratio"], data["e2e_lo"], data["e2e_hi"])],
        "E2E, baseline first / later": [f"{_fmt(a, math.nan, math.nan)} / {_fmt(b, math.nan, math.nan)}"
                                       for a, b in zip(data["e2e_ratio_baseline_first"],
                                                       data["e2e_ratio_baseline_later"])],
        "load (max)": data["load_max"].map(lambda v: f"{v:.2f}" if math.isfinite(v) else "-"),
    })
    devices = ", ".join(sorted({str(d) for d in data["device"]}))
    return [Table("speed_block", "Table 5 timed alone: every arm from the same state, interleaved rounds", data, (
        f"Measured by the spec's speed block on {devices}, after training, with no other solbench work on the machine: "
        f"every arm from the same model state, {int(rows['iteration'].max()) + 1} iteration(s) per arm and round after "
        "a warm-up, the arms of a round back to back in an order rotated each round, each at its own threads. Seconds: "
        "median over rounds of each round's median iteration (rollout = explore + select + regenerate + rollout + "
        "reward; E2E = every phase but evaluation). Speedup: baseline / arm seconds within each round (a paired "
        f"ratio), geometric mean over rounds with the {level:.0%} t interval of the mean log ratio. 'baseline first / "
        "later': the ratio of the rounds where the baseline ran first and of the others (the rotation balances them). "
        f"{rejected_rounds(rows)} round attempt(s) were repeated or left unfinished (load above the bound "
        f"{rows['load_bound'].iloc[0]}, or interrupted) and are not counted."), display=display)]


def block_ratio_of(tables: Tables, runs: pd.DataFrame, kind: str) -> float:
    """The speed block's paired ratio (``kind`` rollout or E2E, eager sampling) of the block arm that times the
    training arm of ``runs`` (the same method and explore recipe); NaN where the block did not time it."""
    data = block_ratios(tables)
    if data.empty or runs.empty:
        return math.nan
    method = str(runs["method"].iloc[0])
    mine = data[(data["variant"] == "eager") & data["method"].map(lambda m: same_method(str(m), method))]
    if "p_quant.recipe" in runs and len(mine) > 1:
        mine = mine[mine["recipe"].astype(str) == str(runs["p_quant.recipe"].iloc[0])]
    col = "rollout_ratio" if kind == "rollout" else "e2e_ratio"
    return float(mine[col].iloc[0]) if len(mine) else math.nan
