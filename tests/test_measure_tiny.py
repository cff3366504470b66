"""scripts/measure_tiny.py, the one command behind every row of issue 26's lever table
(docs/embedded-world.md): its numbers are the fidelity runs' and the pretraining evaluation's own."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from _scripts import script_module

from solbench.measure.tiny_accuracy import evaluate


def test_measure_tiny_reports_the_fidelity_runs_and_the_evaluation_it_ran(tmp_path, capsys):
    """Bugs caught: pooling the sets by their means instead of over prompts (two sets of 2 and 1 prompts weigh
    2:1), a set's rho taken from the other reward's rows, the coverage of one recipe written under another,
    the accuracy sampled at another shift / step count / guidance than the pretraining evaluation's, and a
    missing weights folder or a malformed --sets accepted silently."""
    from solbench.fidelity.experiment import summary
    from solbench.models.tiny import asset_path, load_tiny
    from solbench.results import RunStore

    measure = script_module("measure_tiny")
    assets = str(asset_path("tiny_t2i.json").parent)
    out = tmp_path / "m.json"
    rc = measure.main(["--model-path", assets, "--out", str(out), "--sets", "shapes/heldout:2,shapes/eval:1",
                       "--recipes", "nvfp4_tiny,none", "--accuracy-seeds", "1", "--guidances", "none,3"])
    assert rc == 0
    got = json.loads(out.read_text())
    assert "| assets |" in capsys.readouterr().out.splitlines()[-1]

    runs = {}
    for spec_file in (tmp_path / "m.runs" / "measure_tiny").glob("*/spec.json"):
        spec = json.loads(spec_file.read_text())
        frame = pd.DataFrame(RunStore(spec_file.parent, spec_file.parent.name).read("candidates"))
        runs[(spec["quant"]["recipe"], spec["prompts"]["set"])] = (spec, summary(frame).set_index("reward_name"))
    assert len(runs) == 4
    for recipe in ("nvfp4_tiny", "none"):
        rec = got["fidelity"][recipe]
        for reward in ("shapes_geneval", "shapes_clip"):
            held = runs[(recipe, "shapes/heldout")][1].loc[reward, "spearman_rho"]
            ev = runs[(recipe, "shapes/eval")][1].loc[reward, "spearman_rho"]
            assert rec["sets"]["shapes/heldout"][reward] == pytest.approx(held, abs=1e-4)
            assert rec["sets"]["shapes/eval"][reward] == pytest.approx(ev, abs=1e-4)
            assert rec["pooled"][reward]["mean"] == pytest.approx((2 * held + ev) / 3, abs=1e-4)
            assert rec["pooled"][reward]["prompts"] == 3
        assert runs[(recipe, "shapes/heldout")][0]["sampling"]["shift"] == 3.0
    assert got["fidelity"]["nvfp4_tiny"]["coverage"]["quantized_linears"] == 16
    assert got["fidelity"]["none"]["coverage"] is None

    direct = evaluate(load_tiny(folder=Path(assets)), "shapes/heldout", seeds=1, steps=10, guidances=(None, 3.0),
                      shift=3.0)["by_guidance"]
    for key in ("none", "cfg3"):
        assert got["accuracy"][key]["accuracy"] == direct[key]["accuracy"]
        assert got["accuracy"][key]["per_skill"] == {k: v["strict"] for k, v in direct[key]["per_skill"].items()}
        assert got["accuracy"][key]["weakest"] == min(v["strict"] for v in direct[key]["per_skill"].values())

    assert measure.main(["--model-path", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.json")]) == 2
    with pytest.raises(SystemExit, match="not SET:N"):
        measure.parse_sets("shapes/heldout")
