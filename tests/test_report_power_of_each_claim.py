"""The power of every claim (issue 48): the mde is the crossed interval's own (checked by simulation), seeds_needed
and prompts_needed follow the variance components, findings.csv carries mde, seeds_needed, prompts_needed, the
explore recipe and what deciding a claim would cost, and a measured speedup's power comes from both arms' seeds.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from _report_outputs import linear, named
from fixtures.arm_results import METRIC, Arm, build_arms
from solbench.report import ReportOptions
from solbench.report.stats import crossed_interval

OPTS = ReportOptions(n_boot=200)


def test_the_mde_is_detected_with_80_percent_power_by_simulation():
    """Catches a power formula that is not the interval's own: datasets drawn with known variance components and a
    true effect equal to the design's mde must put the crossed interval wholly above zero about 80 % of the time
    (and the mde at the design's size is the interval's half-width times 1 + t(0.8)/t(0.975))."""
    from solbench.report.stats import Components, variance_components

    rng = np.random.default_rng(0)
    s, p = 4, 30
    true = Components(seed=0.02 ** 2, prompt=0.05 ** 2, resid=0.03 ** 2, n_seeds=s, n_prompts=p)
    mde = true.detectable(s, p)
    hits = 0
    n = 600
    for _ in range(n):
        x = (mde + rng.normal(0, 0.02, (s, 1)) + rng.normal(0, 0.05, (1, p)) + rng.normal(0, 0.03, (s, p)))
        _, lo, _, _ = crossed_interval(x)
        hits += lo > 0
    assert 0.72 <= hits / n <= 0.90
    x = rng.normal(0, 0.02, (s, 1)) + rng.normal(0, 0.05, (1, p)) + rng.normal(0, 0.03, (s, p))
    mean, lo, hi, df = crossed_interval(x)
    c = variance_components(x)
    assert c.detectable(s, p) == pytest.approx((hi - lo) / 2 * (1 + stats.t.ppf(0.8, df) / stats.t.ppf(0.975, df)))


def test_seeds_and_prompts_needed_follow_the_components():
    """Catches a seeds_needed that ignores the prompt term: where prompts dominate, more seeds cannot reach a small
    target (inf: more than 1000, told apart from NaN, not computable), while prompts can; where seeds dominate, the
    count matches a brute-force search of the SE formula sqrt(s2_seed/S + s2_prompt/P + s2_e/(S P))."""
    from solbench.report.stats import Components, units_needed

    prompts = Components(seed=0.0, prompt=0.1 ** 2, resid=0.01 ** 2, n_seeds=3, n_prompts=10)
    assert prompts.prompts_dominate
    assert math.isinf(units_needed(prompts, 0.05, vary="seeds"))
    assert math.isnan(units_needed(Components(math.nan, 0.01, 0.01, 2, 10), 0.05, vary="seeds"))  # 2 seeds
    need = units_needed(prompts, 0.05, vary="prompts")
    assert prompts.detectable(3, int(need)) <= 0.05 < prompts.detectable(3, int(need) - 1)
    seeds = Components(seed=0.04 ** 2, prompt=0.01 ** 2, resid=0.01 ** 2, n_seeds=3, n_prompts=33)
    need = units_needed(seeds, 0.03, vary="seeds")
    z = stats.norm.ppf(0.975) + stats.norm.ppf(0.8)
    normal = next(n for n in range(3, 500) if z * math.sqrt(0.04 ** 2 / n + 0.01 ** 2 / 33 + 0.01 ** 2 / (n * 33)) <= 0.03)
    assert normal <= need <= normal + 3  # t quantiles at few seeds ask a little more than the normal approximation


def test_findings_csv_gains_mde_seeds_needed_prompts_needed_and_recipe(tmp_path):
    """Catches the Findings' single "effects under about +-0.026 cannot be told from zero" for every claim: each
    primary row has its own mde and seeds_needed (and prompts_needed where prompts dominate), shown beside it, and
    every paired row names the explore recipe of the arms it compares."""
    tables = build_arms(tmp_path, "pow", [
        Arm("sol_rl", gain=lambda step, seed: 0.004 * step + 0.003 * seed, seeds=(0, 1, 2),
            phases=[("explore", "explore", 1e9, 1.0), ("train", "full", 1e9, 1.0)],
            extra={"p_quant.recipe": "nvfp4_tiny_flux"}),
        Arm("diffusion_nft", gain=linear(0.002), seeds=(0, 1, 2), phases=[("rollout", "full", 1e9, 1.0)])],
        noise=0.01, options=OPTS)
    findings = named(tables, "findings", "findings")
    data = findings.data
    assert {"mde", "seeds_needed", "prompts_needed", "recipe"} <= set(data.columns)
    assert "components" not in data.columns
    t1 = data[(data["claim"] == "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time") & (data["metric"] == METRIC)].iloc[0]
    assert t1["primary"] and np.isfinite(t1["mde"]) and t1["seeds_needed"] >= 3
    assert t1["recipe"] == "nvfp4_tiny_flux (Sol-RL)"  # DiffusionNFT samples in full precision: not named
    eq = data[(data["claim"] == "Sol-RL beats DiffusionNFT at equal iterations") & (data["metric"] == METRIC)].iloc[0]
    assert eq["mde"] > 0 and not eq["primary"]  # exploratory rows keep their power numbers in the CSV
    cell = findings.display.set_index("claim").loc["Sol-RL beats DiffusionNFT at equal PROJECTED GPU time",
                                                   "power (mde, seeds needed)"]
    assert cell.startswith("mde ") and "seeds (at 6 prompts)" in cell and "Table 1 HPSv2" in cell
    # what deciding it would cost: the missing seeds x the two arms' measured wall seconds per run, on 2 cores
    # (catches a row that says how many seeds but not what they cost, or a cost of the wrong arms or unit)
    walls = tables.metrics.groupby("run_id")["wall_s"].max()
    runs = tables.done_runs.set_index("run_id")
    per_seed = sum(walls[runs.index[runs["method"] == m]].mean() for m in ("sol_rl", "diffusion_nft"))
    assert t1["seed_cost_s"] == pytest.approx(per_seed)
    assert t1["decide_h"] == pytest.approx(max(0, t1["seeds_needed"] - 3) * per_seed / 2 / 3600)
    assert "more on 2 cores" in cell or t1["seeds_needed"] <= 3


def test_a_measured_speedup_has_its_power_from_the_seeds_of_both_arms():
    """Table 5's primary (a ratio of two arms' seconds per iteration, independent seeds) had no mde and no
    seeds_needed: its row could not say what run would decide it. Catches an mde off the t interval's own scale (at
    the mde the interval's half width is t(0.975)/(t(0.975)+t(0.8)) of the distance), a seed count that does not
    reach the target or is not the smallest that does, and a power cell that fails without variance components."""
    from solbench.report.findings_common import Finding
    from solbench.report.findings_power import add_ratio_power, power_cell
    from solbench.report.stats import ratio_ci, ratio_power

    base, target = np.array([10.0, 11.0, 10.5]), np.array([8.0, 9.0, 8.2])
    mde, need = ratio_power(base, target, 0.05)
    vb, vt = base.var(ddof=1) / (3 * base.mean() ** 2), target.var(ddof=1) / (3 * target.mean() ** 2)
    df = (vb + vt) ** 2 / (vb ** 2 / 2 + vt ** 2 / 2)
    lo, hi = ratio_ci(base, target)
    half = (math.log(hi) - math.log(lo)) / 2
    assert math.log1p(mde) == pytest.approx(half * (1 + stats.t.ppf(0.8, df) / stats.t.ppf(0.975, df)))
    assert ratio_power(base, target, mde * 1.0001)[1] <= 3  # its own design detects its mde

    def log_mde(n):  # the design with n seeds per arm, the arms' coefficients of variation held
        vb, vt = base.var(ddof=1) / (n * base.mean() ** 2), target.var(ddof=1) / (n * target.mean() ** 2)
        df = (vb + vt) ** 2 / (vb ** 2 / (n - 1) + vt ** 2 / (n - 1))
        return (stats.t.ppf(0.975, df) + stats.t.ppf(0.8, df)) * math.sqrt(vb + vt)

    assert log_mde(int(need)) <= math.log1p(0.05) < log_mde(int(need) - 1)  # the smallest count that reaches it
    assert math.isnan(ratio_power(base[:1], target, 0.05)[0])
    f = Finding("Sol-RL E2E speedup over naive BF16 scaling (measured)", "Table 5", "", unit="ratio", threshold=1.0)
    f.effect = float(base.mean() / target.mean())
    add_ratio_power(f, base, target)
    assert f.mde == pytest.approx(ratio_power(base, target, f.effect - 1)[0]) and f.seeds_needed >= 2
    assert power_cell(f).startswith(f"mde {1 + f.mde:.2f}x")
