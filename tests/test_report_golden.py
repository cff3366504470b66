"""Golden numbers of the report plugins on the synthetic fixtures (tests/fixtures/synthetic_results.py).

Every expected value is recomputed here from the fixture's DataFrames with plain numpy/scipy, not by
calling the plugin's helpers, so a wrong aggregation, a wrong join or a dropped filter fails.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from fixtures.synthetic_results import (ABLATION_DEFAULT, ABLATION_SETTINGS, FAILED, ablation_final, build_ablation,
                                        build_fidelity, build_main, run_id)
from solbench.report import ReportOptions, Tables, get_kind
from solbench.report.stats import bootstrap_ci, mean_ci

OPTS = ReportOptions(n_boot=300)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return {"main": build_main(root), "ablation": build_ablation(root), "fidelity": build_fidelity(root)}


@pytest.fixture(scope="module")
def main_tables(roots):
    return Tables.load(roots["main"], OPTS)


def _outputs(kind, tables):
    return get_kind(kind)(tables)


def _table(outputs, name):
    found = [o for o in outputs if getattr(o, "name", None) == name]
    assert found, f"no output {name}; got {[getattr(o, 'name', o) for o in outputs]}"
    return found[0].data


def _t_half(x):
    x = np.asarray(x, float)
    return stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))


def test_mean_ci_matches_the_t_formula():
    x = [0.31, 0.35, 0.29, 0.4]
    ci = mean_ci(x)
    assert ci.mean == pytest.approx(np.mean(x))
    assert ci.hi - ci.mean == pytest.approx(_t_half(x))
    one = mean_ci([0.5])
    assert one.n == 1 and math.isnan(one.lo)


def test_main_results_golden(roots, main_tables):
    data = _table(_outputs("main_results", main_tables), "main_results_tiny")
    metrics = pd.read_parquet(roots["main"] / "metrics.parquet")
    for method, arm in (("sol_rl", "Sol-RL"), ("naive_bf16", "naive BF16 scaling"), ("diffusion_nft", "DiffusionNFT")):
        seeds = [s for s in (0, 1, 2) if (method, s) != FAILED[:2]]  # the failed run is left out
        finals, deltas = [], []
        for s in seeds:
            m = metrics[(metrics.run_id == run_id("fx_main", method, s)) & (metrics.metric == "shapes_geneval")]
            finals.append(m.loc[m.step == 12, "value"].item())
            deltas.append(finals[-1] - m.loc[m.step == 0, "value"].item())
        row = data[(data.arm == arm) & (data.metric == "shapes_geneval")].iloc[0]
        assert row["n_seeds"] == len(seeds)
        assert row["mean"] == pytest.approx(np.mean(finals), abs=1e-12)
        assert row["ci_hi"] - row["mean"] == pytest.approx(_t_half(finals), rel=1e-9)
        assert row["delta_mean"] == pytest.approx(np.mean(deltas), abs=1e-12)
        assert row["final_step"] == 12
    base = data[(data.arm == "Base (step 0)") & (data.metric == "shapes_geneval_strict")].iloc[0]
    assert base["mean"] == pytest.approx(np.mean([0.15, 0.155, 0.16]))


def test_timing_golden_medians_after_warmup_and_speedup(roots, main_tables):
    outputs = _outputs("timing", main_tables)
    assert any(getattr(o, "title", "") == "Measured on emulated FP4" for o in outputs)  # CPU caveat
    table5 = _table(outputs, "timing_table5").iloc[0]
    t = pd.read_parquet(roots["main"] / "timings.parquet")
    t = t[t.phase != "eval"]
    rollout_phases = {"explore", "select", "regenerate", "rollout", "reward"}

    def run_medians(method, seeds):
        roll, e2e = [], []
        for s in seeds:
            r = t[(t.run_id == run_id("fx_main", method, s)) & (t.step >= 2)]  # step 1 is the warm-up
            roll.append(r[r.phase.isin(rollout_phases)].groupby("step").seconds.sum().median())
            e2e.append(r.groupby("step").seconds.sum().median())
        return np.array(roll), np.array(e2e)

    nb_roll, nb_e2e = run_medians("naive_bf16", [0, 1])
    sol_roll, sol_e2e = run_medians("sol_rl", [0, 1, 2])
    assert table5["rollout_baseline_s"] == pytest.approx(nb_roll.mean())
    assert table5["rollout_target_s"] == pytest.approx(sol_roll.mean())
    assert table5["e2e_target_s"] == pytest.approx(sol_e2e.mean())
    assert table5["rollout_speedup"] == pytest.approx(nb_roll.mean() / sol_roll.mean())
    assert table5["e2e_speedup"] == pytest.approx(nb_e2e.mean() / sol_e2e.mean())
    assert table5["e2e_speedup_lo"] <= table5["e2e_speedup"] <= table5["e2e_speedup_hi"]
    # the warm-up iteration (3x slower) must not leak into the medians: ~0.90 s, not 1.0+
    assert 0.8 < sol_e2e.mean() < 1.0
    phases = _table(outputs, "timing_phases").set_index("arm")
    assert phases.loc["Sol-RL", "phase_explore_s"] > 0 and phases.loc["DiffusionNFT", "phase_explore_s"] == 0


def test_time_to_reach_interpolates():
    from solbench.report.curves import time_to_reach

    wall = np.array([0.0, 10.0, 20.0])
    assert time_to_reach(wall, np.array([0.0, 0.4, 0.8]), 0.6) == pytest.approx(15.0)
    assert time_to_reach(wall, np.array([0.5, 0.4, 0.8]), 0.5) == 0.0
    assert math.isinf(time_to_reach(wall, np.array([0.0, 0.1, 0.2]), 0.6))


def test_convergence_golden(roots, main_tables):
    data = _table(_outputs("convergence", main_tables), "convergence_tiny")
    m = pd.read_parquet(roots["main"] / "metrics.parquet")
    m = m[(m.split == "eval") & (m.metric == "shapes_geneval")]

    def mean_curve(method, seeds):
        ids = [run_id("fx_main", method, s) for s in seeds]
        g = m[m.run_id.isin(ids)].groupby("step")
        return g.wall_s.mean().values, g.value.mean().values

    def first_crossing(wall, value, target):
        i = int(np.argmax(value >= target))
        assert value[i] >= target
        return wall[i - 1] + (target - value[i - 1]) * (wall[i] - wall[i - 1]) / (value[i] - value[i - 1])

    ref_w, ref_v = mean_curve("diffusion_nft", [0, 1, 2])
    target = ref_v[-1]
    sol_w, sol_v = mean_curve("sol_rl", [0, 1, 2])
    expected = first_crossing(ref_w, ref_v, target) / first_crossing(sol_w, sol_v, target)
    rows = data[data.metric == "shapes_geneval"].set_index("arm")
    assert rows.loc["Sol-RL", "target"] == pytest.approx(target)
    assert rows.loc["Sol-RL", "speedup"] == pytest.approx(expected)
    assert rows.loc["DiffusionNFT", "speedup"] == pytest.approx(1.0)
    assert rows.loc["Sol-RL", "speedup_lo"] < expected < rows.loc["Sol-RL", "speedup_hi"]
    assert math.isinf(rows.loc["FlowGRPO", "time_to_target_s"])  # never reaches DiffusionNFT's final score


def test_bootstrap_ci_is_deterministic_and_needs_two_units():
    a, b = np.array([1.0, 1.2, 0.9]), np.array([0.5, 0.55])
    ratio = lambda x, y: x.mean() / y.mean()  # noqa: E731
    assert bootstrap_ci([a, b], ratio, n_boot=200, seed=3) == bootstrap_ci([a, b], ratio, n_boot=200, seed=3)
    assert all(math.isnan(v) for v in bootstrap_ci([a, b[:1]], ratio, n_boot=50))


def _sets_by_rule(r, k):
    order = sorted(range(len(r)), key=lambda i: (-r[i], i))  # descending, ties by index
    top = set(order[:k])
    bw = set(order[: k // 2]) | set(order[len(r) - (k - k // 2):])
    return top, bw


def test_ranking_fidelity_all_seeds_golden(roots):
    tables = Tables.load(roots["fidelity"], OPTS)
    outputs = _outputs("ranking_fidelity", tables)
    groups = _table(outputs, "ranking_fidelity_groups").set_index("prompt_id")
    c = pd.read_parquet(roots["fidelity"] / "candidates.parquet")
    taus, hits8 = [], []
    for pid, g in c.groupby("prompt_id"):
        proxy = g[g.precision == "explore"].sort_values("cand_idx").reward.values
        full = g[g.precision == "full"].sort_values("cand_idx").reward.values
        row = groups.loc[pid]
        assert row["kind"] == "all seeds" and row["n_pairs"] == 16
        assert row["kendall_tau"] == pytest.approx(stats.kendalltau(proxy, full)[0])
        assert row["spearman_rho"] == pytest.approx(stats.spearmanr(proxy, full)[0])
        for k in (4, 8, 12):
            tp, bp = _sets_by_rule(proxy, k)
            tf, bf = _sets_by_rule(full, k)
            assert row[f"hit@{k}"] == pytest.approx(len(tp & tf) / k)
            assert row[f"overlap@{k}"] == pytest.approx(len(bp & bf) / k)
        taus.append(row["kendall_tau"])
        hits8.append(row["hit@8"])
    summary = _table(outputs, "ranking_fidelity").iloc[0]
    assert summary["n_groups"] == 6
    assert summary["kendall_tau_mean"] == pytest.approx(np.mean(taus))
    assert summary["hit@8_mean"] == pytest.approx(np.mean(hits8))


def test_ranking_fidelity_training_candidates_are_within_the_selected(roots, main_tables):
    outputs = _outputs("ranking_fidelity", main_tables)
    groups = _table(outputs, "ranking_fidelity_groups")
    assert set(groups["kind"]) == {"selected only"}  # naive BF16 rows (full only) are never paired
    assert (groups["n_pairs"] == 4).all() and (groups["n_explore"] == 8).all()
    c = pd.read_parquet(roots["main"] / "candidates.parquet")
    rid = run_id("fx_main", "sol_rl", 1)
    g = c[(c.run_id == rid) & (c.step == 3) & (c.prompt_id == "p1")]
    full = g[g.precision == "full"].sort_values("cand_idx")
    proxy = g[g.precision == "explore"].set_index("cand_idx").loc[full.cand_idx, "reward"].values
    row = groups[(groups.run_id == rid) & (groups.step == 3) & (groups.prompt_id == "p1")].iloc[0]
    assert row["kendall_tau"] == pytest.approx(stats.kendalltau(proxy, full.reward.values)[0])
    top_p = set(np.argsort(-proxy)[:2])
    top_f = set(np.argsort(-full.reward.values)[:2])
    assert row["side_agreement"] == pytest.approx(1 - 2 * len(top_p - top_f) / 4)


def test_ablations_golden(roots):
    tables = Tables.load(roots["ablation"], OPTS)
    data = _table(_outputs("ablations", tables), "ablations_tiny_sol_rl")
    assert len(data) == len(ABLATION_SETTINGS)
    for setting in ABLATION_SETTINGS:
        cfg = {**ABLATION_DEFAULT, **setting}
        row = data[(data["candidates N"] == cfg["n"]) & (data["explore steps"] == cfg["explore_steps"])
                   & (data["selection mode"] == cfg["selection"])]
        assert len(row) == 1
        finals = [ablation_final(cfg, s) for s in (0, 1)]
        assert row["shapes_geneval_mean"].item() == pytest.approx(np.mean(finals))
        assert row["shapes_geneval_hi"].item() - row["shapes_geneval_mean"].item() == pytest.approx(_t_half(finals))
    labels = tables.arm_order()
    assert labels.index("Sol-RL (explore_steps=4, n=8, selection=best_worst)") < \
        labels.index("Sol-RL (explore_steps=4, n=16, selection=best_worst)")


def test_sweep_heatmap_golden(roots):
    tables = Tables.load(roots["ablation"], OPTS)
    outputs = _outputs("sweep_heatmap", tables)
    cells = _table(outputs, "sweep_heatmap").set_index(["n", "k"])
    trials = pd.read_parquet(roots["ablation"] / "sweep" / "trials.parquet")
    done = trials[trials.state == "COMPLETE"]
    assert cells["trials"].sum() == len(done)  # the FAIL trial is dropped
    assert cells.loc[(16, 4), "mean"] == pytest.approx(done[(done.params_n == 16) & (done.params_k == 4)].value.mean())
    best = _table(outputs, "sweep_top_trials").iloc[0]
    assert (best["n"], best["k"], best["value"]) == (32, 4, pytest.approx(done.value.max()))
    fig = [o for o in outputs if o.name == "sweep_heatmap"][0].figure
    # these trials have no per-sample eval rows: no cell has an interval, so the top is not called best
    assert "N=32, K=4" in fig.axes[0].get_title() and "not judged" in fig.axes[0].get_title()


def test_sweep_from_an_optuna_storage(tmp_path):
    import optuna

    from solbench.report.sweep_io import load_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    (tmp_path / "sweep").mkdir()
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'sweep' / 'study.db'}",
                                direction="minimize")
    for n, k in ((8, 2), (16, 4), (16, 2)):
        study.enqueue_trial({"n": n, "k": k})
        study.optimize(lambda t: t.suggest_int("n", 8, 16) / 10 + t.suggest_int("k", 2, 4), n_trials=1)
    trials, direction = load_trials(tmp_path / "sweep")
    assert direction == "minimize"
    assert sorted(zip(trials.n, trials.k)) == [(8, 2), (16, 2), (16, 4)]
    assert trials.set_index(["n", "k"]).loc[(16, 4), "value"] == pytest.approx(5.6)


# FLOPs of one forward as counted by solbench.models.flops (torch FlopCounterMode on the meta device), at each pipeline's
# maximum text length (solbench.models.flops.REAL_MODELS: FLUX 512, SD3.5 333, SANA 300 tokens).
FLOP_COUNTER_GOLDEN = {("flux", 512): 21.50260015104e12, ("flux", 1024): 74.384653418496e12,
                       ("sd3", 512): 7.9777863936e12, ("sd3", 1024): 31.121114907648e12,
                       ("sana", 512): 0.8366159872e12, ("sana", 1024): 2.96666116096e12}


@pytest.mark.parametrize("model,resolution", list(FLOP_COUNTER_GOLDEN))
def test_closed_form_flops_match_the_flop_counter(model, resolution):
    from solbench.models.flops import REAL_MODELS
    from solbench.measure.paper_models import forward_flops

    f = forward_flops(model, resolution, text_tokens=REAL_MODELS[model].text_tokens)
    assert f.total == pytest.approx(FLOP_COUNTER_GOLDEN[(model, resolution)], rel=5e-3)
    assert 0 < f.attention < f.linear


def test_closed_form_flops_match_a_live_flop_count():
    pytest.importorskip("diffusers")
    from solbench.models.flops import REAL_MODELS
    from solbench.measure.paper_models import forward_flops

    assert forward_flops("sana", 256).total == pytest.approx(REAL_MODELS["sana"].forward_flops(256), rel=5e-3)


def test_cost_projection_formula_and_labels(main_tables):
    from solbench.measure.paper_models import forward_flops
    from solbench.report.cost import HARDWARE, PaperSetting, paper_projection, stored_models
    from solbench.report.stored import paper_model_facts

    # formulas by hand for FLUX.1 (one forward per step, 512 px, 4 trained timesteps), on the facts collected with
    # the results; the fit to every Table 5 cell is tests/test_cost_projection.py
    models = stored_models(paper_model_facts(main_tables))
    df = paper_projection(models, "B200", mfu=0.5).set_index("model")
    f = forward_flops("flux", 512)
    s = PaperSetting()
    m = models["flux"]
    bf16, fp4 = 2.25e15 * 8, 9e15 * 8
    fwd = f.linear / (bf16 * 0.5) + f.attention / (bf16 * s.attention_mfu)
    fwd_e = f.quantized / (fp4 * 0.5) + (f.linear - f.quantized) / (bf16 * 0.5) + f.attention / (bf16 * s.attention_mfu)
    image = (m.vae_tflops + m.reward_tflops) * 1e12 / (bf16 * 0.5)
    text = 48 * m.text_tflops * 1e12 / (bf16 * 0.5)
    naive = 48 * 96 * (10 * fwd + image) + text
    sol = 48 * 96 * (6 * fwd_e + image) + 48 * 24 * (10 * fwd + image) + 2 * text
    train = 48 * 24 * m.train_timesteps * 5 * fwd
    assert df.loc["FLUX.1", "rollout_naive_projected_s"] == pytest.approx(naive)
    assert df.loc["FLUX.1", "rollout_sol_projected_s"] == pytest.approx(sol)
    assert df.loc["FLUX.1", "e2e_naive_projected_s"] == pytest.approx(naive + train)
    assert df.loc["FLUX.1", "e2e_sol_projected_s"] == pytest.approx((sol + train) / (1 - s.requant_share))
    assert df.loc["FLUX.1", "rollout_naive_rel_error"] == pytest.approx(naive / 184 - 1)
    h100 = paper_projection(models, "H100", mfu=0.5).set_index("model")
    assert "rollout_naive_paper_s" not in h100  # no paper numbers for hardware the paper did not use
    assert HARDWARE["H100"].explore_peak() == (1.98, "FP8")
    outputs = _outputs("cost_projection", main_tables)
    for out in outputs:
        assert "PROJECT" in out.title and "PROJECTION" in out.caption
