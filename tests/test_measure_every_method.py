"""`solbench doctor SPEC --measure --tiny` over the three real specs (issue 46): every method on every real model's
tiny components, 21 of 21 pairs, and every timed phase did its work.

The bug it holds: FlowGRPO's train phase measured as a 0.0004 s phase with 0 FLOPs on flux_main, sd35_main and
sana_main, because reward models on random weights tie (every advantage zero, nothing trained). The measurement now
scores with solbench.measure.work.UntiedReward (the random-weight model's score plus each image's mean pixel
value), and a phase that did no work says so instead of printing a time. To keep it to about a minute on two cores,
each run takes its method's tiny_config sizes (a group of 3-4 instead of 24-96) and two sampling steps; the
spec's method, model, micro-batches, LoRA, recipe, rewards and sampler stay as they are.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from solbench.method import get_method
from solbench.measure.iteration import measure_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ("flux_main", "sd35_main", "sana_main")
METHODS = ("sol_rl", "naive_scaling", "naive_fp4", "diffusion_nft", "flow_grpo", "dance_grpo", "awm")
SAMPLING_PHASES = ("explore", "regenerate", "rollout")


def _small(cfg):
    return dataclasses.replace(cfg, method_config={**cfg.method_config, **get_method(cfg.method).tiny_config},
                               sampling=dataclasses.replace(cfg.sampling, steps=2))


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS)
def test_every_method_of_every_real_spec_does_work_in_every_timed_phase(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the specs' prompt files are not needed (the measurement writes its own)
    result = measure_spec(ROOT / "experiments" / f"{spec}.yaml", tmp_path / "out", tiny=True, budget_s=1e9,
                          configure=_small)
    assert [m["method"] for m in result["methods"]] == list(METHODS) and result["left_out"] == []
    for m in result["methods"]:
        assert not m["error"], (spec, m["method"], m["error"])
        assert m["trained"] is True, (spec, m["method"], "no trainable parameter changed")
        phases = [p["phase"] for p in m["phases"]]
        assert "train" in phases and "reward" in phases and any(p in phases for p in SAMPLING_PHASES), phases
        for row in m["phases"]:
            if row["phase"] in (*SAMPLING_PHASES, "train"):
                assert row["flops"] > 0 and row["did_work"] is True, (spec, m["method"], row)
            elif row["phase"] == "reward":
                assert row["n_images"] > 0 and row["did_work"] is True, (spec, m["method"], row)
    page = (tmp_path / "out" / "measure.md").read_text()
    assert "unmeasured (no work)" not in page and "did no work" not in page


def test_a_phase_that_did_no_work_is_reported_unmeasured_not_timed():
    """The table's side: a train phase with FLOPs but no changed parameter, or without FLOPs, prints no time."""
    from solbench.measure.work import did_work
    from solbench.measure.table import markdown

    train = {"phase": "train", "precision": "full", "seconds": 0.0004, "n_images": 0, "flops": None,
             "seconds_per_forward": None, "peak_gb": 0.0, "predicted_gb": 1.0}
    assert did_work(train, True) is False and did_work({**train, "flops": 1e9}, False) is False
    assert did_work({**train, "flops": 1e9}, True) is True and did_work({**train, "phase": "select"}, True) is None
    train["did_work"] = False
    page = markdown({"spec": "s.yaml", "device": "CPU", "tiny": True, "torch": "x", "elapsed_s": 1, "budget_s": 1,
                     "methods": [{"method": "flow_grpo", "run_id": "r", "phases": [train], "setup_s": 0, "iteration_s": 0,
                                  "recipe": "", "notes": [], "error": "", "trained": False}],
                     "left_out": [], "not_measured": []})
    assert "| flow_grpo | train | full | 0 | unmeasured (no work) |" in page and "0.0004" not in page
    assert "no trainable parameter changed" in page


def test_untied_reward_keeps_the_models_work_and_breaks_its_ties():
    """The stand-in: the wrapped model is still called on every image (its time is measured), its score is kept,
    each image's mean pixel value is added, and attributes the trainer sets (batch_size) reach the model."""
    import torch

    from solbench.measure.work import UntiedReward

    seen = []

    class Constant:
        batch_size = 4

        def __call__(self, images, prompts):
            seen.append(images.shape[0])
            return torch.full((images.shape[0],), 0.0599)

    reward = UntiedReward(Constant())
    images = torch.stack([torch.full((3, 4, 4), v) for v in (0.1, 0.2, 0.3)])
    scores = reward(images, ["a", "b", "c"])
    assert seen == [3] and torch.allclose(scores, torch.tensor([0.1599, 0.2599, 0.3599]))
    reward.batch_size = 2
    assert reward.inner.batch_size == 2 and reward.batch_size == 2
