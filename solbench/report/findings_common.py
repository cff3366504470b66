"""What the Findings modules share: the ``Finding`` row, value formatting, and which arms a claim
compares (the main arm of a method, the arms along an axis, the training and held-out rewards).
findings.py collects and renders the rows; findings_quality.py and findings_speed.py compute them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from solbench.report.stats import NOT_MEASURED, verdict
from solbench.report.tables import HORIZON, Tables, _hashable, _sort_key, same_method

REWARDS_DISAGREE = "rewards disagree"
TRAINING, HELD_OUT = "training", "held-out"
#: the eval reward that stands for the paper's own reward of a claim (Table 4: shapes_clip for the CLIP score); where
#: a claim has one, it leads the claim instead of the training reward
PAPER_REWARD = "counterpart of the paper's reward"
#: a binary reward's Table 8 row: described, not judged against a threshold set for graded rewards
NOT_JUDGED = "not judged (binary reward)"


@dataclass
class Finding:
    claim: str
    paper_table: str
    paper: str  # the paper's figure, as text
    effect: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    unit: str = ""  # "abs", "rel", "ratio", "rho"
    threshold: float = math.nan
    direction: str = "greater"
    verdict: str = NOT_MEASURED
    covers: str = ""  # what the interval covers
    detail: str = ""  # arms, metric, step, why not measured; for projections their inputs
    model: str = ""
    metric: str = ""
    role: str = ""  # training | held-out (reward claims), "" otherwise
    key: str = ""  # rows of one claim on several rewards share it (default: the claim)
    prompts_only: bool = False  # the interval covers eval prompts only: seed-to-seed variance not estimated
    per_seed: str = ""  # each run seed's paired difference (CSV)
    interval_note: str = ""  # why a bound is missing or infinite, shown beside the interval
    primary: bool = False  # one of the claims named before the data (findings.PRIMARY)
    recipe: str = ""  # the explore recipe of the arms the row compares, "method: recipe; ..." (runs' resolved config)
    mde: float = math.nan  # smallest distance from the threshold detected with 80 % power at 5 % (docs/reports.md, Power)
    seeds_needed: float = math.nan  # run seeds (at the current prompts) to detect the target distance
    prompts_needed: float = math.nan  # eval prompts (at the current seeds), where prompts dominate the variance
    power_note: str = ""  # the target distance and where it came from
    seed_cost_s: float = math.nan  # one more run seed of the compared arms: the sum of their runs' mean wall seconds
    decide_h: float = math.nan  # what the seeds_needed design adds, in hours on 2 cores (findings_power.add_cost)
    n_arm_seeds: int = 0  # run seeds per arm of a design without variance components (a measured speedup)
    components: object = None  # stats.Components of the paired design (not written to findings.csv)
    base_mean: float = math.nan  # the baseline arm's mean score (scales a paper effect given as a relative change)
    # issue 54 (solbench.report.findings_multiplicity, solbench.report.readout)
    p_value: float = math.nan  # two-sided p of the effect against the threshold, from the row's own interval
    holm_p: float = math.nan  # Holm's adjusted p over the primary family
    adjusted_verdict: str = ""  # primary: the verdict at Holm's level; exploratory: "hypothesis (...)"
    readout_flag: str = ""  # the reading is past a held-out reward's fall from its peak (reward hacking)
    df: float = math.nan  # degrees of freedom of the row's t interval (NaN: not a t interval)

    def decide(self) -> "Finding":
        self.verdict = verdict(self.lo, self.hi, self.threshold, self.direction)
        return self

    def group(self) -> str:
        return self.key or self.claim


def fmt_value(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "-"
    if unit == "rel":
        return f"{value:+.2%}"
    if unit == "ratio":
        return f"{value:.2f}x"
    if unit == "rho":
        return f"{value:.3f}"
    return f"{value:+.4f}"


# ---- arms -----------------------------------------------------------------------------------------

def main_arm(tables: Tables, runs: pd.DataFrame, method: str) -> str | None:
    """The arm of ``method`` to compare: the one with most seeds (ablation arms have fewer), then the one on the
    explore copy most common among ALL of ``runs`` (``p_quant.recipe``: an arm on another copy is another experiment,
    the dose-response's; naive FP4's three copies with 3 seeds each tie among its own runs), then the one with the
    most other settings at their most common value (the default ablations vary around), then the one whose
    horizon (iterations) is the most common, then the first in order. The horizon comes last: an arm run longer
    than the ablations around it is still their default, compared with them at equal iterations."""
    arms = [a for a in tables.arm_order(runs) if same_method(runs.loc[runs["arm"] == a, "method"].iloc[0], method)]
    if not arms:
        return None
    mine = runs[runs["arm"].isin(arms)]
    counts = mine.groupby("arm")["seed"].nunique()
    varying = [c for c in tables.setting_columns() if c in mine and mine[c].map(_hashable).nunique() > 1]
    modes = {c: (runs if _setting_group(c) == 0 else mine)[c].map(_hashable).value_counts().index[0] for c in varying}

    def at_default(arm: str, which: int) -> int:  # settings of one group at their most common value
        run = mine[mine["arm"] == arm].iloc[0]
        return sum(_hashable(run[c]) == v for c, v in modes.items() if _setting_group(c) == which)

    return max(arms, key=lambda a: (counts.get(a, 0), at_default(a, 0), at_default(a, 1), at_default(a, 2),
                                    -arms.index(a)))


def _setting_group(column: str) -> int:
    """main_arm's order of settings: 0 the explore copy (p_quant.recipe), 1 the others (the backend among them: it
    follows from the recipe and the machine, and methods without an explore copy record one too), 2 the horizon."""
    return 0 if column == "p_quant.recipe" else 2 if column == HORIZON else 1


def axis_arms(tables: Tables, runs: pd.DataFrame, method: str, axis: str) -> dict:
    """{value of method_config.<axis>: arm} with every other varying method setting at its most common value.
    The horizon (iterations) is not held: arms of other horizons are compared at the iterations both reached;
    where one value has arms of several horizons, ``main_arm`` picks among them (most seeds first)."""
    mine = runs[runs["method"].map(lambda m: same_method(m, method))]
    col = f"p_method_config.{axis}"
    if mine.empty or col not in mine or mine[col].map(_hashable).nunique() < 2:
        return {}
    others = [c for c in tables.setting_columns() if c not in (col, HORIZON) and c in mine
              and mine[c].map(_hashable).nunique() > 1]
    keep = pd.Series(True, index=mine.index)
    for c in others:
        values = mine[c].map(_hashable)
        keep &= values == values.value_counts().index[0]
    out: dict = {}
    held = mine[keep]
    for value in held[col].map(_hashable).dropna().unique():
        arm = main_arm(tables, held[held[col].map(_hashable) == value], method)
        if arm is not None:
            out[value] = arm
    return dict(sorted(out.items(), key=lambda kv: _sort_key(kv[0])))


def training_rewards(tables: Tables, runs: pd.DataFrame) -> set[str]:
    """Rewards the runs trained on (``p_rewards.<name>`` with a non-zero weight)."""
    names = set()
    for column in runs.columns:
        if column.startswith("p_rewards.") and pd.to_numeric(runs[column], errors="coerce").fillna(0).ne(0).any():
            names.add(column[len("p_rewards."):])
    return names


def trained_rewards(tables: Tables, runs: pd.DataFrame) -> set[str]:
    """The training rewards (``training_rewards``), or, for results that do not record them, the spec's first
    eval reward, as ``reward_roles`` takes it."""
    headline = tables.headline_metric()
    return training_rewards(tables, runs) or ({headline} if headline else set())


def reward_roles(tables: Tables, runs: pd.DataFrame) -> list[tuple[str, str]]:
    """[(eval reward, training | held-out)], the training reward(s) first. Results that do not record the
    training rewards take the spec's first eval reward as the training one."""
    rewards = tables.eval_rewards()
    trained = training_rewards(tables, runs) & set(rewards) or set(rewards[:1])
    return [(r, TRAINING) for r in rewards if r in trained] + [(r, HELD_OUT) for r in rewards if r not in trained]


#: Methods that sample with an explore copy (their runs' ``p_quant.recipe`` is the copy they explored with).
EXPLORING_METHODS = ("sol_rl", "naive_fp4")


def seed_cost_s(tables: Tables, model: str, arms) -> float:
    """The seconds one more run seed of ``arms`` takes: per arm the mean over its done runs of the run's last
    recorded wall clock (``wall_s`` of its metrics rows), summed over the arms; a run computes on one core (its
    numerics.threads, 1 in the embedded specs), so this is core-seconds too. NaN where an arm has no rows."""
    runs, m = tables.done_runs, tables.metrics
    if m.empty or "wall_s" not in m:
        return math.nan
    last_wall = pd.to_numeric(m["wall_s"], errors="coerce").groupby(m["run_id"]).max().dropna()  # per run
    total = 0.0
    for arm in dict.fromkeys(a for a in arms if a):
        ids = runs.loc[(runs["model"] == model) & (runs["arm"] == arm), "run_id"]
        walls = last_wall[last_wall.index.isin(ids)]
        if walls.empty:
            return math.nan
        total += float(walls.mean())
    return total


def arms_recipe(tables: Tables, model: str, arms) -> str:
    """The explore recipe of the arms a row compares, from their runs' resolved config (``p_quant.recipe``):
    "nvfp4_tiny_flux (Sol-RL, naive FP4)" when they share one, "Sol-RL: a; naive FP4: b" otherwise; arms that
    sample in full precision only (DiffusionNFT, naive BF16 scaling, ...) have none and are not named."""
    from solbench.report.explore import explore_runs

    runs = tables.done_runs
    runs = runs[runs["model"] == model] if "model" in runs else runs
    explored = set(explore_runs(tables)["run_id"])
    named: dict[str, str] = {}
    for arm in dict.fromkeys(a for a in arms if a):
        mine = runs[runs["arm"] == arm]
        if mine.empty or "p_quant.recipe" not in mine:
            continue
        if not (mine["run_id"].isin(explored).any() or any(same_method(m, x) for m in mine["method"].unique()
                                                          for x in EXPLORING_METHODS)):
            continue
        recipes = sorted({str(v) for v in mine["p_quant.recipe"].dropna()})
        if recipes:
            named[arm] = ", ".join(recipes)
    if not named:
        return "none (full precision only)" if arms else ""
    if len(set(named.values())) == 1:
        return f"{next(iter(named.values()))} ({', '.join(named)})"
    return "; ".join(f"{arm}: {recipe}" for arm, recipe in named.items())
