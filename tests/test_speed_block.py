"""The speed block (solbench.speed): Table 5 timed alone, arms interleaved and rotated, paired within rounds.

Most tests drive ``run_rounds`` with fake arms whose phase seconds come from a fake clock (a function of the arm,
the round and the position in it), and a fake load meter, so nothing here is timed; one test runs the real block
on the tiny model through the CLI.
"""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import pandas as pd
import pytest

from solbench.config import RunConfig
from solbench.spec.speed_arms import Arm, round_order
from solbench.speed.block import ROUNDS, ROWS, QuietMachineError, read_rounds, run_rounds
from solbench.results.speed_rows import speed_table
from solbench.report.speed_stats import paired_ratios, ratio_interval, round_power, round_seconds

REPO = Path(__file__).resolve().parents[1]


def _arms(*names):
    return [Arm(name, "eager", RunConfig(method=name)) for name in names]


def _block(**kw):
    from solbench.spec.models import SpeedBlock

    return SpeedBlock(**{"rounds": 4, "iterations": 2, "warmup": 1, "load_bound": 0.25, "repeats": 2, **kw})


class FakeArms:
    """make_runner for run_rounds on a fake clock: each arm's runner returns phases whose seconds are ``cost[arm]``
    times a drift that grows with every call (``drift``: a machine that slows down over the block) times
    ``first_penalty`` for the arm that runs first in its round (a cold cache: the first call of a step not seen
    before); ``log`` records (arm, step) of every call, warm-ups included; ``fail_at`` (arm, step) raises there."""

    def __init__(self, cost: dict, first_penalty: float = 1.0, drift: float = 0.05, fail_at: tuple | None = None):
        self.cost, self.first_penalty, self.drift, self.fail_at = cost, first_penalty, drift, fail_at
        self.log: list[tuple[str, int]] = []
        self.seen: set[int] = set()

    def __call__(self, arm):
        def runner(step):
            if self.fail_at is not None and (arm.key, step) == self.fail_at:
                raise KeyboardInterrupt("killed")
            first = step not in self.seen
            self.seen.add(step)
            self.log.append((arm.key, step))
            base = self.cost[arm.key] * (1.0 + self.drift * len(self.log)) * (self.first_penalty if first else 1.0)
            return [{"phase": "rollout", "precision": "full", "seconds": 0.6 * base},
                    {"phase": "reward", "precision": "", "seconds": 0.1 * base},
                    {"phase": "train", "precision": "full", "seconds": 0.3 * base}]

        runner.backend, runner.device_name = "emulated", "fake CPU"
        return runner


class Meter:
    """A load meter reading a schedule of loads, one per timed iteration (the last repeated)."""

    def __init__(self, loads):
        self.loads, self.i = list(loads), 0

    def start(self):
        return None

    def stop(self, mark):
        value = self.loads[min(self.i, len(self.loads) - 1)]
        self.i += 1
        return value


def _rows(folder: Path) -> pd.DataFrame:
    return speed_table(folder.parent.parent)


def _run(folder, arms, block, fake, meter=None):
    return run_rounds(folder, arms, block, fake, load_meter=meter or Meter([0.0]), echo=lambda m: None)


def test_arms_run_interleaved_in_an_order_rotated_each_round(tmp_path):
    """Each round runs every arm once, its M iterations back to back, in the block's order rotated by the round's
    index, and the same steps (prompts) for every arm of a round; rounds.jsonl records that order. Catches a block
    that times one arm's rounds all together (arms far apart in time), never rotates (one arm always first) or
    gives arms of a round different prompts."""
    arms = _arms("naive_scaling", "sol_rl", "naive_fp4")
    fake = FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0, "naive_fp4": 1.5})
    block = _block(rounds=4, iterations=2, warmup=1)
    folder = tmp_path / "exp" / "speed" / "b1"
    _run(folder, arms, block, fake)
    timed = fake.log[3:]  # after the three warm-ups (one iteration each, step 1)
    assert fake.log[:3] == [("naive_scaling", 1), ("sol_rl", 1), ("naive_fp4", 1)]
    expected = []
    for r in range(4):
        order = [a.key for a in round_order(arms, r)]
        assert order == (["naive_scaling", "sol_rl", "naive_fp4"] * 2)[r % 3: r % 3 + 3]
        for key in order:
            expected += [(key, 1 + r * 2 + 1), (key, 1 + r * 2 + 2)]
    assert timed == expected
    rounds = read_rounds(folder)
    assert [r["order"] for r in rounds] == [[a.key for a in round_order(arms, r)] for r in range(4)]
    assert all(r["accepted"] for r in rounds)
    rows = _rows(folder)
    assert set(rows["position"]) == {0, 1, 2} and rows.groupby(["round", "arm"])["iteration"].nunique().eq(2).all()


def test_a_round_above_the_load_bound_is_repeated_then_the_block_gives_up(tmp_path):
    """A round whose busiest iteration's load passes the bound is written as rejected and run again; when every try
    of a round is loud, the block stops after 1 + repeats tries with a message saying it could not get a quiet
    machine, keeping the rounds accepted before. Catches a block that keeps a loud round, repeats forever, or
    loses what it measured when it gives up."""
    arms = _arms("naive_scaling", "sol_rl")
    block = _block(rounds=3, iterations=1, warmup=0, repeats=2)
    folder = tmp_path / "exp" / "speed" / "b1"
    # round 0: quiet (2 iterations); round 1: one arm loud on the first try, then quiet
    meter = Meter([0.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 0.0])
    _run(folder, arms, block, FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0}), meter)
    rounds = read_rounds(folder)
    assert [(r["round"], r["accepted"]) for r in rounds] == [(0, True), (1, False), (1, True), (2, True)]
    assert rounds[1]["load"] == pytest.approx(0.9)
    rows = _rows(folder)
    assert rows["accepted"].sum() == 3 * 2 * 3  # 3 rounds x 2 arms x 3 phases
    assert (~rows["accepted"]).sum() == 2 * 3  # the rejected try's rows are kept, not counted

    loud = tmp_path / "exp2" / "speed" / "b1"
    meter = Meter([0.0, 0.0] + [0.8] * 100)  # round 0 quiet, then never quiet
    with pytest.raises(QuietMachineError, match=r"could not get a quiet machine: round 2 of 3 ran 3 times .*0\.80.*"
                                                r"bound 0\.25.*the 1 accepted round\(s\) are kept"):
        _run(loud, arms, block, FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0}), meter)
    assert [(r["round"], r["accepted"]) for r in read_rounds(loud)] == [(0, True), (1, False), (1, False), (1, False)]


def test_ratios_are_paired_within_rounds(tmp_path):
    """Each round's ratio is the baseline's seconds over the arm's in the same round: on a machine that slows down
    through the block (the fake clock drifts +5 % a call), arms that cost 2:1 give a ratio near 2 in every round
    with a tight interval. Catches ratios formed across rounds (the drift would spread them) or of pooled means."""
    arms = _arms("naive_scaling", "sol_rl")
    fake = FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0})
    folder = tmp_path / "exp" / "speed" / "b1"
    _run(folder, arms, _block(rounds=6, iterations=1, warmup=0), fake)
    rounds = round_seconds(_rows(folder))
    pairs = paired_ratios(rounds, "naive_scaling")
    assert list(pairs["round"]) == list(range(6)) and set(pairs["arm"]) == {"sol_rl"}
    for r in range(6):
        base = rounds[(rounds["arm"] == "naive_scaling") & (rounds["round"] == r)]["e2e_s"].iloc[0]
        arm = rounds[(rounds["arm"] == "sol_rl") & (rounds["round"] == r)]["e2e_s"].iloc[0]
        assert pairs.loc[pairs["round"] == r, "e2e_ratio"].iloc[0] == pytest.approx(base / arm)
    point, lo, hi, sd = ratio_interval(pairs["e2e_ratio"])
    assert 1.85 < lo < point < hi < 2.15
    # the drift over the block is much larger than that: seconds of one arm differ by >20 % between rounds
    sol = rounds[rounds["arm"] == "sol_rl"]["e2e_s"]
    assert sol.max() / sol.min() > 1.2


def test_an_interrupted_block_resumes_without_losing_or_repeating_a_round(tmp_path):
    """A block killed between rounds, and one killed inside a round (after its first arm), continues at the first
    round without an accepted line: in the end every round is accepted exactly once with M iterations of every arm,
    and the killed round's partial rows are not counted. Catches a resume that restarts from round 0 (rounds run
    twice), skips the killed round (lost), or counts a half-written round."""
    arms = _arms("naive_scaling", "sol_rl")
    block = _block(rounds=4, iterations=2, warmup=1)
    folder = tmp_path / "exp" / "speed" / "b1"
    # killed between rounds: at round 2's first timed step of its first arm (sol_rl runs first in round 1? no: 2)
    first_of_round2 = round_order(arms, 2)[0].key
    with pytest.raises(KeyboardInterrupt):
        _run(folder, arms, block, FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0},
                                           fail_at=(first_of_round2, 1 + 2 * 2 + 1)))
    assert [r["round"] for r in read_rounds(folder) if r["accepted"]] == [0, 1]
    # killed inside round 2: after its first arm wrote its rows
    second_of_round2 = round_order(arms, 2)[1].key
    with pytest.raises(KeyboardInterrupt):
        _run(folder, arms, block, FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0},
                                           fail_at=(second_of_round2, 1 + 2 * 2 + 1)))
    assert [r["round"] for r in read_rounds(folder) if r["accepted"]] == [0, 1]
    fake = FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0})
    summary = _run(folder, arms, block, fake)
    assert summary["ran"] == [2, 3] and summary["accepted"] == [0, 1, 2, 3]
    assert {step for _, step in fake.log} == {1, 6, 7, 8, 9}  # warm-up, then rounds 2 and 3 only
    rounds = read_rounds(folder)
    assert sorted(r["round"] for r in rounds if r["accepted"]) == [0, 1, 2, 3]
    rows = _rows(folder)
    accepted = rows[rows["accepted"]]
    assert accepted.groupby(["round", "arm"])["iteration"].nunique().eq(2).all()
    assert len(accepted) == 4 * 2 * 2 * 3  # rounds x arms x iterations x phases: nothing twice
    assert (~rows["accepted"]).sum() == 2 * 3  # the half-written round 2: one arm's two iterations, not counted
    assert (folder / first_of_round2 / ROWS).is_file() and (folder / ROUNDS).is_file()


@pytest.mark.parametrize("first", ["naive_scaling", "sol_rl"])
def test_the_ratio_does_not_depend_on_which_arm_runs_first(tmp_path, first):
    """With a cold-cache penalty on whichever arm runs first in a round (+10 % on the fake clock), a forced block
    order with either arm first gives the same ratio, the true 2:1, because the rotation puts each arm first in
    half the rounds; the report's 'baseline first / later' split shows the effect. Catches a block that does not
    rotate (the ratio would be 2.2 or 1.8 depending on the order the spec lists the arms in)."""
    order = ["naive_scaling", "sol_rl"] if first == "naive_scaling" else ["sol_rl", "naive_scaling"]
    fake = FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0}, first_penalty=1.1, drift=0.0)
    folder = tmp_path / first / "speed" / "b1"
    _run(folder, _arms(*order), _block(rounds=6, iterations=1, warmup=0), fake)
    assert fake.log[0][0] == first  # the forced order: the listed arm runs first in round 0
    pairs = paired_ratios(round_seconds(_rows(folder)), "naive_scaling")
    point, lo, hi, _ = ratio_interval(pairs["e2e_ratio"])
    assert point == pytest.approx(2.0, rel=1e-9)
    assert pairs["first"].sum() == 3  # the baseline ran first in half the rounds
    by_first = pairs.groupby("first")["e2e_ratio"].mean()
    assert by_first[True] == pytest.approx(2.2) and by_first[False] == pytest.approx(2.0 / 1.1)


def test_power_comes_from_the_round_spread_against_a_declared_target():
    """The rounds needed follow from the round-to-round sd of the log ratio and the declared target, not the
    observed ratio: a larger target needs fewer rounds, a zero-spread design needs the minimum. Catches a power cell
    computed from the observed effect (circular) or from seeds."""
    mde, need_small = round_power(0.10, 5, 1.10)
    _, need_large = round_power(0.10, 5, 1.62)
    assert need_large < need_small and need_large >= 2 and math.isfinite(mde)
    assert round_power(0.0, 5, 1.62)[1] == 2.0
    assert math.isnan(round_power(math.nan, 1, 1.62)[0])


def _tiny_spec(tmp_path, speed: str) -> Path:
    spec = tmp_path / "speed_tiny.yaml"
    spec.write_text(f"""name: speed_tiny
base:
  model: {{name: tiny}}
  rewards: {{shapes_geneval: 1.0}}
  train_prompts: shapes/train
  prompts_per_iter: 1
  iterations: 1
  finetune: {{mode: lora, lora_rank: 2, lora_alpha: 4}}
  sampling: {{steps: 2, eval_steps: 2}}
  eval: {{every: 1, prompts: shapes/eval, n_prompts: 1, seeds_per_prompt: 1, rewards: [shapes_geneval]}}
matrix:
  method: [naive_scaling, sol_rl]
  n: [4]
  k: [2]
  explore_steps: [1]
speed:
{speed}
""")
    return spec


def test_the_spec_names_what_is_wrong_in_a_speed_block(tmp_path):
    """An arm that is no method of the spec, an arm named twice, and a set key that is no run setting are refused
    when the spec is expanded, naming the line and key. Catches a block that fails only after training."""
    from solbench.errors import ConfigError
    from solbench.spec import load_spec

    cases = {"  arms: [naive_scaling, sol_rll]": r"speed_tiny.yaml:\d+: speed\.arms\[1\]: 'sol_rll' is no method",
             "  arms: [sol_rl, sol_rl]": r"speed\.arms\[1\]: arm 'sol_rl' is named twice",
             "  arms: [naive_scaling, {name: fp, method: sol_rl, set: {quant.recip: none}}]":
                 r"speed\.arms\[1\]: set\.quant\.recip: no such run setting"}
    for text, message in cases.items():
        with pytest.raises(ConfigError, match=message):
            load_spec(_tiny_spec(tmp_path, text))
    spec = load_spec(_tiny_spec(tmp_path, "  arms: [naive_scaling, {name: fp, method: sol_rl, set: {quant.recipe: "
                                          "none}}]"))
    from solbench.spec.speed_arms import block_arms

    arms = block_arms(spec.runs, spec.speed)
    assert [a.key for a in arms] == ["naive_scaling", "fp"] and arms[1].config.quant.recipe == "none"


def test_the_block_runs_on_the_tiny_model_through_the_cli(tmp_path, monkeypatch):
    """`solbench speed SPEC` times the real arms (the trainer's iteration) on the tiny model: rounds written,
    each arm's rows with phases, the CPU, the backend and threads, collected by speed_table; run again it times
    only the rounds it lacks when --rounds is raised (the same block, continued). Catches a block that only
    works with fakes, or reruns finished rounds."""
    from solbench.cli import main

    monkeypatch.setenv("SOLBENCH_CORE_LOCKS", str(tmp_path / "locks"))  # cores of its own, whatever else runs here
    spec = _tiny_spec(tmp_path, "  arms: [naive_scaling, sol_rl]\n  rounds: 2\n  iterations: 1\n  warmup: 0\n"
                                "  load_bound: 1000")  # a busy test machine: the load repeat is tested above
    results = tmp_path / "results"
    assert main(["speed", str(spec), "--results", str(results), "--no-report"]) == 0
    rows = speed_table(results / "speed_tiny")
    assert set(rows["arm"]) == {"naive_scaling", "sol_rl"} and rows["accepted"].all()
    assert {"explore", "regenerate", "train"} <= set(rows.loc[rows["arm"] == "sol_rl", "phase"])
    assert "rollout" in set(rows.loc[rows["arm"] == "naive_scaling", "phase"])
    assert set(rows.loc[rows["arm"] == "sol_rl", "backend"]) <= {"emulated", "cpu_bf16"}
    assert (rows["seconds"] > 0).all() and rows["device"].astype(bool).all() and (rows["threads"] == 1).all()
    before = len(rows)
    assert main(["speed", str(spec), "--results", str(results), "--no-report", "--rounds", "3"]) == 0
    rows = speed_table(results / "speed_tiny")
    assert rows["block_id"].nunique() == 1 and sorted(rows["round"].unique()) == [0, 1, 2]
    assert len(rows) == before * 3 // 2  # rounds 0 and 1 not timed again: one round more
    # Table 5 from the block (solbench.report.speed_block), read from the collected table
    rows.to_parquet(results / "speed_tiny" / "speed.parquet")
    from solbench.report.speed_block import block_ratios
    from solbench.report.tables import ReportOptions

    ratios = block_ratios(types.SimpleNamespace(results_dir=results / "speed_tiny",
                                                options=ReportOptions(baseline_method="naive_scaling")))
    sol = ratios[ratios["arm"] == "sol_rl"].iloc[0]
    assert sol["rounds"] == 3 and sol["e2e_ratio"] > 0 and sol["e2e_lo"] <= sol["e2e_ratio"] <= sol["e2e_hi"]
    assert json.loads((next((results / "speed_tiny" / "speed").iterdir()) / "status.json").read_text())["state"] == "done"


def test_sampling_variants_time_every_arm_eager_and_compiled_alike(tmp_path):
    """``sampling: [eager, compiled]`` times every arm in both variants, as arms of their own (model.compile off and
    on, nothing else changed), and the paired ratio pairs each arm with the baseline of its own variant. Catches a
    compiled variant for one arm only (an unfair pair) or ratios across variants."""
    from solbench.spec import load_spec
    from solbench.spec.speed_arms import block_arms

    spec = load_spec(_tiny_spec(tmp_path, "  arms: [naive_scaling, sol_rl]\n  sampling: [eager, compiled]"))
    arms = block_arms(spec.runs, spec.speed)
    assert [a.key for a in arms] == ["naive_scaling", "sol_rl", "naive_scaling@compiled", "sol_rl@compiled"]
    assert [a.config.model.compile for a in arms] == ["off", "off", "on", "on"]
    for eager, compiled in ((arms[0], arms[2]), (arms[1], arms[3])):
        a, b = eager.config.to_dict(), compiled.config.to_dict()
        a["model"].pop("compile"), b["model"].pop("compile")
        assert a == b
    cost = {"naive_scaling": 2.0, "sol_rl": 1.0, "naive_scaling@compiled": 1.0, "sol_rl@compiled": 0.25}
    folder = tmp_path / "exp" / "speed" / "b1"
    _run(folder, arms, _block(rounds=4, iterations=1, warmup=0), FakeArms(cost, drift=0.0))
    pairs = paired_ratios(round_seconds(_rows(folder)), "naive_scaling")
    ratios = pairs.groupby(["arm", "variant"])["e2e_ratio"].apply(lambda r: ratio_interval(r)[0])
    assert ratios[("sol_rl", "eager")] == pytest.approx(2.0) and ratios[("sol_rl", "compiled")] == pytest.approx(4.0)


def test_arms_that_do_not_fit_together_are_built_and_freed_in_their_turn(tmp_path):
    """``resident`` False (real models on one GPU): each arm is built and warmed up before its turn in every round
    and closed after it, so one arm's networks are in memory at a time. Catches a block that keeps every arm built
    (out of GPU memory with three FLUX arms) or times an arm before its warm-up."""
    arms = _arms("naive_scaling", "sol_rl")
    events = []

    def make(arm):
        runner = FakeArms({"naive_scaling": 2.0, "sol_rl": 1.0})(arm)
        events.append(("build", arm.key))
        runner.close = lambda: events.append(("close", arm.key))
        return runner

    summary = run_rounds(tmp_path / "exp" / "speed" / "b1", arms, _block(rounds=2, iterations=1, warmup=1),
                               make, load_meter=Meter([0.0]), echo=lambda m: None, resident=False)
    assert summary["accepted"] == [0, 1]
    assert events == [("build", "naive_scaling"), ("close", "naive_scaling"), ("build", "sol_rl"), ("close", "sol_rl"),
                      ("build", "sol_rl"), ("close", "sol_rl"), ("build", "naive_scaling"), ("close", "naive_scaling")]
