"""Table 5 from a speed block's rows: per-round paired ratios, their interval over rounds, and power.

From speed.parquet (solbench.results.speed_rows), the accepted rounds of the latest block. Per arm, round and
iteration: rollout seconds (the rollout phases) and end-to-end seconds (every phase but evaluation and compile,
as solbench.report.timing sums a training iteration); a round's value is the median over its M iterations. The
arms of one round ran back to back, so each round gives one paired ratio per arm, baseline seconds / arm seconds
(the baseline: the block's first arm, in the same sampling variant). Over R rounds: the geometric mean of the
paired ratios with the Student t interval of the mean log ratio (R - 1 degrees of freedom). Power: the
round-to-round standard deviation of the log ratio against a declared target ratio (the block's ``target`` or the
paper's, never the observed one): mde, and the rounds that would detect the target with 80 % power at 5 %.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

ROLLOUT_PHASES = ("explore", "select", "regenerate", "rollout", "reward")
NOT_TIMED = ("eval", "compile")
ALPHA, POWER = 0.05, 0.80


def latest_block(speed: pd.DataFrame) -> pd.DataFrame:
    """The rows of the block that started last (a spec whose block changed keeps the former one's rows)."""
    if speed is None or speed.empty:
        return pd.DataFrame()
    last = speed.sort_values("started_at", kind="stable")["block_id"].iloc[-1]
    return speed[speed["block_id"] == last]


def round_seconds(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (key, arm, variant, round): the median over its iterations of rollout_s and e2e_s, accepted rounds only,
    with the round's load and position."""
    r = rows[rows["accepted"].astype(bool) & ~rows["phase"].isin(NOT_TIMED)].copy()
    if r.empty:
        return pd.DataFrame(columns=["key", "arm", "variant", "round", "rollout_s", "e2e_s", "load", "position"])
    r["rollout"] = np.where(r["phase"].isin(ROLLOUT_PHASES), r["seconds"], 0.0)
    keys = ["key", "arm", "variant", "round", "iteration"]
    it = r.groupby(keys, as_index=False).agg(rollout_s=("rollout", "sum"), e2e_s=("seconds", "sum"),
                                              load=("load", "max"), position=("position", "first"))
    return it.groupby(keys[:-1], as_index=False).agg(rollout_s=("rollout_s", "median"), e2e_s=("e2e_s", "median"),
                                                    load=("load", "max"), position=("position", "first"))


def paired_ratios(rounds: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Per (arm, variant, round): baseline seconds / arm seconds, both of the same round (rollout and E2E)."""
    out = []
    for variant, v in rounds.groupby("variant"):
        base = v[v["arm"] == baseline].set_index("round")
        for arm, a in v[v["arm"] != baseline].groupby("arm", sort=False):
            a = a.set_index("round")
            both = base.index.intersection(a.index)
            for index in both:
                out.append({"arm": arm, "variant": variant, "round": int(index),
                            "rollout_ratio": base.at[index, "rollout_s"] / a.at[index, "rollout_s"],
                            "e2e_ratio": base.at[index, "e2e_s"] / a.at[index, "e2e_s"],
                            "first": base.at[index, "position"] == 0})
    return pd.DataFrame(out, columns=["arm", "variant", "round", "rollout_ratio", "e2e_ratio", "first"])


def ratio_interval(ratios, level: float = 0.95) -> tuple[float, float, float, float]:
    """(geometric mean, lo, hi, sd of the log ratio) over rounds; NaN bounds with fewer than two rounds."""
    logs = np.log(np.asarray(ratios, dtype=float))
    logs = logs[np.isfinite(logs)]
    if len(logs) == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(logs.mean())
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan, math.nan
    sd = float(logs.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, len(logs) - 1)) * sd / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half), sd


def _log_mde(sd: float, n: int) -> float:
    return (float(stats.t.ppf(1 - ALPHA / 2, n - 1)) + float(stats.t.ppf(POWER, n - 1))) * sd / math.sqrt(n)


def round_power(sd: float, n: int, target: float, limit: int = 1000) -> tuple[float, float]:
    """(mde as ratio - 1 at n rounds, rounds that detect ``target``): the paired design's power from the
    round-to-round sd of the log ratio, against a declared target ratio (> 1); NaN without an sd."""
    if not (math.isfinite(sd) and n >= 2):
        return math.nan, math.nan
    mde = math.exp(_log_mde(sd, n)) - 1
    if not (math.isfinite(target) and target > 1):
        return mde, math.nan
    goal = math.log(target)
    return mde, next((float(k) for k in range(2, limit + 1) if _log_mde(sd, k) <= goal), math.inf)


#: Table 5's ratios by the paper's model a spec's model stands for (the tiny model explores at FLUX's coverage)
PAPER_RATIOS = {"flux": (2.33, 1.62), "tiny": (2.33, 1.62), "sd3": (2.41, 1.61), "sana": (1.41, 1.25)}
