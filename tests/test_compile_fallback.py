"""Compilation that falls back (issue 46): a sampling network whose compiled blocks fail to compile goes back
to eager, says why, and the run goes on.

torch.compile is replaced by a stand-in whose compiled call raises (the way an inductor lowering error or a
dynamo failure on a GPU image's torch would), so no real compilation runs: these tests take seconds.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from solbench.models import compile as compiling


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def _failing_compile(monkeypatch, error: BaseException, *, after: int = 0):
    """torch.compile's stand-in: the compiled call runs eagerly ``after`` times, then raises ``error``."""
    calls = {"n": 0}

    def fake_compile(fn, **kwargs):
        def compiled(*args, **kw):
            calls["n"] += 1
            if calls["n"] > after:
                raise error
            return fn(*args, **kw)
        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


def test_a_compile_error_on_the_first_call_falls_back_to_eager_for_the_whole_network(monkeypatch, caplog):
    """The bug: a compile error in the first compiled call (peft under dynamo, an inductor lowering of the FP8
    cast) ending the run. Here the network's output is the eager one, the listener hears the cause once,
    the warning names it, and the failed compiled code is never called again (every block of the network
    is eager from then on, not only the one that failed)."""
    model = _Blocks()
    calls = _failing_compile(monkeypatch, RuntimeError("inductor: cannot lower float8 cast\nsecond line"))
    assert compiling.compile_blocks(model, "default") == 3
    heard = []
    assert compiling.on_fallback(model, heard.append) is None
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = model(x)
        with compiling.sampling(), caplog.at_level(logging.WARNING, logger="solbench.models.compile"):
            got = model(x)
            again = model(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(again, want, rtol=0, atol=0)
    assert calls["n"] == 1  # one failed attempt; the other blocks and the second call ran eager
    assert heard == [{"network": "_Blocks", "block": "Linear", "error": "RuntimeError: inductor: cannot lower float8 cast"}]
    assert "samples eagerly from now on" in caplog.text and "cannot lower float8 cast" in caplog.text
    # asked afterwards, the record comes back at once
    assert compiling.on_fallback(model, heard.append)["error"].startswith("RuntimeError")


def test_out_of_memory_and_errors_after_a_good_call_are_not_compile_errors(monkeypatch):
    """The bug the fallback could bring: hiding a real error (out of memory, a failure once the compiled code
    has run) behind a silent switch to eager. Those propagate; a dynamo error at a later recompile falls back."""
    model = _Blocks()
    _failing_compile(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"))
    compiling.compile_blocks(model, "default")
    with torch.no_grad(), compiling.sampling(), pytest.raises(torch.OutOfMemoryError):
        model(torch.randn(2, 8))

    model = _Blocks()
    _failing_compile(monkeypatch, ValueError("a shape bug"), after=3)  # the first forward's three blocks succeed
    compiling.compile_blocks(model, "default")
    with torch.no_grad(), compiling.sampling():
        model(torch.randn(2, 8))
        with pytest.raises(ValueError, match="a shape bug"):
            model(torch.randn(2, 8))

    from torch._dynamo.exc import InternalTorchDynamoError

    model = _Blocks()
    _failing_compile(monkeypatch, InternalTorchDynamoError("recompile failed"), after=3)
    compiling.compile_blocks(model, "default")
    heard = []
    compiling.on_fallback(model, heard.append)
    with torch.no_grad(), compiling.sampling():
        model(torch.randn(2, 8))
        model(torch.randn(4, 8))  # a new batch size: dynamo recompiles, and fails
    assert [h["error"] for h in heard] == ["InternalTorchDynamoError: recompile failed"]


def test_a_run_whose_compiled_sampling_fails_finishes_eager_and_rollout_json_says_why(monkeypatch, tmp_path):
    """The tiny model with model.compile on (merged rollout copy and the LoRA roles compiled) and a compiler
    that fails on the first call: the run trains and evaluates to the end, and rollout.json names the network
    that fell back and the error. Catches a user's first GPU run dying in compiled sampling, and a fallback
    that happens silently (the record written at setup, before any compiled call, would say nothing)."""
    from _tiny_config import small_config

    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    _failing_compile(monkeypatch, RuntimeError("triton: no compiler for this GPU"))
    cfg = small_config("naive_scaling", experiment="compile_fallback", planned_iterations=1, seed=0)
    cfg.model.compile, cfg.model.rollout_copy = "on", "merged"
    store = RunStore(tmp_path / cfg.run_id, cfg.run_id)
    trainer = Trainer(cfg, store)
    assert trainer.nets.compiled_blocks > 0
    assert store.read_json("rollout.json")["compile_fallback"] == []
    trainer.run()
    record = store.read_json("rollout.json")
    assert record["compile_mode"] == "default"
    # the rollout samples through the merged copy, the evaluation through the policy (its LoRA role): both fell back
    assert sorted(r["role"] for r in record["compile_fallback"]) == ["policy", "rollout_copy"]
    for entry in record["compile_fallback"]:
        assert entry["block"] == "FluxTransformerBlock"
        assert entry["error"] == "RuntimeError: triton: no compiler for this GPU"
    assert [r["step"] for r in store.read("metrics") if r.get("split") == "eval"], "the run did not evaluate"
