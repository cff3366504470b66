"""scripts/rollout_speed.py at toy size (issue 46): a speed script that cannot lose the key row.

The tiny FLUX of tests/test_measure.py's spec, every arm of the default plan. torch.compile is replaced by a
stand-in (the compiled call runs the eager code, or raises), so the compiled arms' code path runs here in seconds;
the real compilation of the arms is the GPU session's (docs/measured/README.md).
"""

from __future__ import annotations

import argparse
import csv
import json
import textwrap

import pytest
import torch

from _scripts import script_module
from test_measure import SPEC


@pytest.fixture
def speed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(textwrap.dedent(SPEC))
    module = script_module("rollout_speed")

    def run(*, inject=None, arms=None):
        args = argparse.Namespace(spec=str(spec), tiny=True, repeats=1, budget=1e9, compile="on",
                                  plan=module.parse_plan(arms), inject_failure=inject)
        out = tmp_path / "out"
        out.mkdir(exist_ok=True)
        return module.measure(args, out), out

    return module, run


def _fake_compile(monkeypatch, error=None):
    def fake(fn, **kwargs):
        def compiled(*args, **kw):
            if error is not None:
                raise error
            return fn(*args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", fake)


def test_an_arm_that_fails_loses_no_other_row_and_the_files_follow_every_arm(speed, monkeypatch):
    """The bugs of issue 46: one arm raising (peft under dynamo, an inductor lowering of the FP8 cast) lost every
    later arm, and rollout_speed.json was written only at the end. Here the compiled merged arm raises: its row
    carries the error, every other arm of the plan has its row (or a reason it was skipped), the CSV and JSON are
    rewritten after each arm, and the plan starts with the compiled FP8 explore arms."""
    module, run = speed
    _fake_compile(monkeypatch)
    written = []
    real_write = module.write_outputs
    monkeypatch.setattr(module, "write_outputs", lambda out, d: written.append(len(out["rows"])) or real_write(out, d))
    result, out = run(inject="merged:compiled")
    assert module.DEFAULT_PLAN[0] == "explore_fast:compiled" and module.DEFAULT_PLAN[1] == "explore_rowwise:compiled"
    rows = {(r["arm"], r["compiled"]): r for r in result["rows"]}
    assert rows[("merged", True)]["error"] == "InjectedFailure: --inject-failure merged:compiled"
    assert rows[("merged", True)]["seconds_per_forward"] is None
    done = {(a, c) for (a, c), r in rows.items() if not r["error"]}
    assert {("merged", False), ("lora", False), ("lora", True), ("explore", False), ("explore_rowwise", False)} <= done
    for key in done:
        assert rows[key]["seconds_per_forward"] > 0 and rows[key]["tflops"] > 0
    skipped = " | ".join(result["skipped"])
    # no CUDA: explore_fast has no fast accumulation to add, the emulated copies are not compiled; each says so
    assert "explore_fast eager: fast accumulation does not apply" in skipped
    accounted = len(result["rows"]) + len(result["skipped"])
    assert accounted == len(module.DEFAULT_PLAN) and len(written) == len(module.DEFAULT_PLAN)
    assert written == sorted(written) and written[-1] == len(result["rows"])
    with (out / "rollout_speed.csv").open() as handle:
        csv_rows = list(csv.DictReader(handle))
    assert list(csv_rows[0]) == list(module.COLUMNS) and len(csv_rows) == len(result["rows"])
    saved = json.loads((out / "rollout_speed.json").read_text())
    assert saved["rows"] == result["rows"] and "lora_compiled_vs_eager" in saved["ratios"]


def test_a_compiled_arm_that_fell_back_to_eager_is_an_error_not_a_time(speed, monkeypatch):
    """solbench.models.compile falls back to eager when compilation fails; the speed script must not then report eager
    code as the compiled row. Catches a compiled row that silently timed eager forwards."""
    module, run = speed
    _fake_compile(monkeypatch, RuntimeError("inductor: lowering float8 cast failed"))
    result, _ = run(arms="merged:compiled,merged:eager")
    compiled, eager = result["rows"]
    assert compiled["error"] == "RuntimeError: compilation fell back to eager: RuntimeError: inductor: lowering float8 cast failed"
    assert compiled["seconds_per_forward"] is None and eager["seconds_per_forward"] > 0 and not eager["error"]


def test_a_plan_item_that_is_not_an_arm_is_refused(speed):
    module, _ = speed
    with pytest.raises(SystemExit, match="--arms item 'fp8:compiled' is not ARM:compiled"):
        module.parse_plan("fp8:compiled")
    assert module.parse_plan("explore:eager,lora:compiled") == [("explore", False), ("lora", True)]
