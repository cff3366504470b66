"""The sweep report answers from R seeds per cell (solbench/report/sweep_cells.py, sweep_answer.py, the heat map in
ablations.py): each cell's mean over its run seeds x eval prompts with the crossed interval, the best set by
Holm-adjusted paired tests against the top cell, the reward-against-measured-time front, and the one sentence on
the best (N, K) and Table 3's trend (or the seeds that would decide it).

The sweep runs ``_runfns.eval_samples_run`` (final score per eval prompt n/16 + prompt effect + a residual of sd 0.05
seeded by (n, k, seed, prompt)) with 3 seeds per cell, so every number is computed here by hand."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from _runfns import SAMPLE_PROMPTS, sample_value
from solbench.config import RunConfig
from solbench.report.stats import crossed_interval
from solbench.report.sweep_answer import answer_sentence, front_mask, trends
from solbench.spec import load_spec

TESTS = Path(__file__).resolve().parent

SPEC = """
name: answers
launch: local
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 2
  iterations: 2
  eval: {every: 2, prompts: shapes/eval, n_prompts: 8, seeds_per_prompt: 1, rewards: [shapes_geneval]}
matrix:
  method: [sol_rl]
  seed: [0]
sweep:
  trials: 3
  seeds_per_cell: 3
  sampler: grid
  storage: journal
  pruner: {kind: none}
  params: {n: {choices: [4, 14, 16]}, k: {choices: [2]}}
"""


def _matrix(n: int) -> np.ndarray:
    return np.array([[sample_value(RunConfig(method="sol_rl", method_config={"n": n, "k": 2}, seed=s), p)
                      for p in range(SAMPLE_PROMPTS)] for s in range(3)])


def test_cells_best_set_and_answer_from_three_seeds_per_cell(tmp_path):
    """Bug caught: a cell's interval covered one run's eval prompts and the best set came from unadjusted tests;
    here each cell pools its 3 seeds x 8 prompts, the comparisons with the top are Holm-adjusted, and the sentence
    names the best cell and Table 3's trend with its paired interval."""
    from solbench.report.ablations import sweep_heatmap
    from solbench.report.sweep_cells import sweep_cells
    from solbench.report.tables import Tables
    from solbench.collect import collect
    from solbench.sweep import Sweep

    path = tmp_path / "answers.yaml"
    path.write_text(textwrap.dedent(SPEC))
    results = tmp_path / "results"
    Sweep(load_spec(path), results, run_fn="_runfns:eval_samples_run", sys_path=[str(TESTS)], poll_s=0.2,
          workers=1).run()
    collect(results / "answers")
    tables = Tables.load(results / "answers")
    cells, info = sweep_cells(tables)
    cells = cells.set_index("n")
    for n in (4, 14, 16):
        mean, lo, hi, _ = crossed_interval(_matrix(n))
        assert (cells.loc[n, "mean"], cells.loc[n, "lo"], cells.loc[n, "hi"]) == pytest.approx((mean, lo, hi))
        assert cells.loc[n, "runs"] == 3 and cells.loc[n, "covers"] == "3 run seeds x 8 eval prompts"
    # the comparisons with the top (n=16), paired on seeds x prompts, their p values Holm-adjusted by hand
    p = {}
    for n in (4, 14):
        d = _matrix(n) - _matrix(16)
        mean, lo, hi, df = crossed_interval(d)
        se = (hi - lo) / 2 / stats.t.ppf(0.975, df)
        p[n] = 2 * stats.t.sf(abs(mean) / se, df)
        assert cells.loc[n, "vs_top"] == pytest.approx(mean)
    small, large = sorted(p, key=p.get)
    holm = {small: min(1, 2 * p[small])}
    holm[large] = max(holm[small], min(1, p[large]))
    for n in (4, 14):
        assert cells.loc[n, "p_holm"] == pytest.approx(holm[n])
    # the first step's interval is at 1 - 0.05 / 2, the second at 1 - 0.05
    lo, hi = crossed_interval(_matrix(small) - _matrix(16), 0.975)[1:3]
    assert (cells.loc[small, "vs_top_lo"], cells.loc[small, "vs_top_hi"]) == pytest.approx((lo, hi))
    assert info["decided"] and list(cells.index[cells["in_best_set"]]) == [16]

    found = trends(cells.reset_index(), info)
    (trend,) = found
    mean, lo, hi, _ = crossed_interval(_matrix(16) - _matrix(4))
    assert (trend["n_small"], trend["n_large"], trend["verdict"]) == (4, 16, "holds")
    assert (trend["mean"], trend["lo"], trend["hi"]) == pytest.approx((mean, lo, hi))
    sentence = answer_sentence(cells.reset_index(), info, found, "2 iterations")
    assert sentence.startswith("At 2 iterations, the best cell is n=16, k=2 (")
    assert f"at K=2, N=16 vs N=4: {mean:+.4f} [{lo:+.4f}, {hi:+.4f}] (holds)" in sentence

    heat = next(o for o in sweep_heatmap(tables) if o.name == "sweep_heatmap")
    data = heat.data.set_index("n")
    assert data.loc[16, "lo"] == pytest.approx(cells.loc[16, "lo"]) and data.loc[16, "runs"] == 3

    # the first page opens on that sentence and the heat map, not on the method headline (one arm's curve beside an
    # empty Table 5 panel) nor on a table of primary rows this one-method sweep has no runs for
    from solbench.report import ReportOptions, write_report

    options = ReportOptions(n_boot=50, kinds=("findings", "sweep_heatmap", "sweep_cells", "timing"))
    index = write_report(results / "answers", reports_root=tmp_path / "reports", options=options, strict=True)
    text = index.read_text()
    answers = text[text.index("## The answers"):]
    first = next(line for line in answers.splitlines() if line.startswith("- "))
    assert first.startswith("- **Which N and K are best here") and sentence[:40] in first
    assert "](sweep_heatmap.png)" in text and "Headline" not in text
    assert "| Table 6" not in text and "(it has no runs of the arms they compare)" in text


def test_the_front_keeps_the_cells_no_other_beats_on_both_reward_and_measured_time():
    """Bug caught: a front that keeps a cell slower and no better than another."""
    reward = pd.Series([1.0, 2.0, 3.0, 2.5, 3.0, math.nan])
    seconds = pd.Series([1.0, 2.0, 3.0, 4.0, 3.5, 0.5])
    assert front_mask(reward, seconds) == [True, True, True, False, False, False]


def test_an_undecided_trend_says_how_many_seeds_would_decide_it():
    """Bug caught: an interval that spans zero read as 'no trend' instead of naming the seeds that would decide it."""
    rng = np.random.default_rng(0)
    prompts = [f"p{i}" for i in range(8)]
    seed_fx = rng.normal(0, 0.02, 3)
    samples = {}
    for n, shift in ((4, 0.0), (16, 0.01)):
        samples[(n, 2)] = {s: pd.Series(shift + seed_fx[s] + rng.normal(0, 0.01, 8) + np.linspace(-0.1, 0.1, 8),
                                        index=prompts) for s in range(3)}
    cells = pd.DataFrame({"n": [4, 16], "k": [2, 2], "label": ["n=4, k=2", "n=16, k=2"], "mean": [0.0, 0.01],
                          "lo": [-0.1, -0.09], "hi": [0.1, 0.11], "in_best_set": [True, True]})
    info = {"params": ["n", "k"], "samples": samples, "level": 0.95, "decided": False}
    (trend,) = trends(cells, info)
    assert trend["verdict"] == "undecided" and trend["lo"] < 0 < trend["hi"]
    assert math.isfinite(trend["seeds_needed"]) and trend["seeds_needed"] > 3
    sentence = answer_sentence(cells, info, [trend], "10 iterations")
    assert "no single (N, K) is best" in sentence
    assert f"about {int(trend['seeds_needed'])} run seeds per cell would detect a difference this size" in sentence


def test_a_study_read_from_its_storage_gives_each_cell_its_seed_runs(tmp_path):
    """Bug caught: without trials.parquet the report read one run_id per trial from the storage and pooled no seeds."""
    import optuna

    from solbench.report.sweep_cells import _run_ids
    from solbench.report.sweep_io import load_trials

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    (tmp_path / "sweep").mkdir()
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 'sweep' / 'optuna.db'}",
                                direction="maximize")
    trial = study.ask({"n": optuna.distributions.CategoricalDistribution([4])})
    trial.set_user_attr("run_ids", ["a1", "b2", "c3"])
    trial.set_user_attr("run_id", "a1")
    study.tell(trial, 0.5)
    trials, _ = load_trials(tmp_path / "sweep")
    assert trials.loc[0, "run_ids"] == "a1; b2; c3" and _run_ids(trials) == ["a1", "b2", "c3"]
