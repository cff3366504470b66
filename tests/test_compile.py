"""Compiled rollout forwards (solbench.models.compile, model.compile): which setting compiles what, and on the
tiny model with compilation on, that every compile happens in the first iteration, is timed as phase
"compile" and not in the rollout, and that the compiled rollout samples with the current weights.

Compiling costs 10-60 s per block class on these CPUs, so the trainer test is one test that checks
everything it can about one compiled run.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solbench.models import compile as compiling
from solbench.errors import ConfigError


def test_settings_resolve_per_device():
    """auto compiles on CUDA only (the CPU default keeps every shipped number), on/off say so, a mode
    name is passed to torch.compile, anything else is a clear error."""
    assert compiling.resolve_compile("auto", "cpu") is None
    assert compiling.resolve_compile("auto", "cuda") == compiling.DEFAULT_MODE == "default"
    assert compiling.resolve_compile("on", "cpu") == "default"
    assert compiling.resolve_compile("off", "cuda") is None
    assert compiling.resolve_compile("max-autotune-no-cudagraphs", "cuda") == compiling.REFERENCE_MODE
    with pytest.raises(ConfigError, match="model.compile must be one of auto, on, off"):
        compiling.resolve_compile("fast", "cuda")


class _Blocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_blocks_come_from_diffusers_or_the_block_lists_and_run_compiled_only_while_sampling(monkeypatch):
    """FLUX names its repeated block classes (diffusers' _repeated_blocks); a model without them gets every
    block of its ModuleLists; a model with neither is an error. A compiled block runs its compiled code only
    inside sampling() without gradients: the training forward stays eager. Catches training through
    compiled code (a backward through graphs the reference never compiles) and compiling the wrong modules."""
    from solbench.models import build_adapter
    from solbench.config import ModelConfig

    flux = build_adapter(ModelConfig(path="random")).transformer
    names = {type(b).__name__ for b in compiling.repeated_blocks(flux)}
    assert names == {"FluxTransformerBlock", "FluxSingleTransformerBlock"}
    assert len(compiling.repeated_blocks(flux)) == len(flux.transformer_blocks) + len(flux.single_transformer_blocks)

    model = _Blocks()
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (lambda *a, **k: calls.append(kw) or fn(*a, **k)))
    assert compiling.compile_blocks(model, "default") == 3
    assert compiling.compile_blocks(model, "default") == 3  # again: nothing wrapped twice
    x = torch.randn(2, 8)
    model(x)
    with torch.no_grad():
        model(x)
    with compiling.sampling():
        model(x)  # gradients on: eager
        assert not calls
        with torch.no_grad():
            model(x)
    assert calls == [{"options": compiling.compile_options("default")}] * 3
    assert compiling.compile_options("max-autotune-no-cudagraphs")["max_autotune"] is True
    # exact division in every mode: the traced FP8 quantizer's scale must keep solbench's quantizer's bits
    assert compiling.compile_options("default")["eager_numerics.division_rounding"] is True
    with pytest.raises(ConfigError, match="no repeated blocks"):
        compiling.compile_blocks(nn.Linear(2, 2), "default")


def test_tiny_model_compiles_in_the_first_iteration_only_and_times_it_apart():
    """naive_scaling on the tiny model with model.compile on (merged rollout copy, LoRA roles): the first
    iteration compiles (dynamo's graph count grows), the second compiles nothing; compilation lands in
    "compile" rows, not in the rollout's; after an update and its refresh the compiled rollout samples what
    the eager one does (the copy's new weights, not weights frozen into the graph). Catches shapes that
    change between iterations, compile time charged to the rollout, and stale compiled weights."""
    from _tiny_config import small_config

    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    cfg = small_config("naive_scaling", experiment="compile", planned_iterations=2, seed=0)
    cfg.model.compile, cfg.model.rollout_copy = "on", "merged"
    import tempfile
    from pathlib import Path

    store = RunStore(Path(tempfile.mkdtemp()) / cfg.run_id, cfg.run_id)
    trainer = Trainer(cfg, store)
    assert trainer.nets.compiled_blocks > 0
    before = compiling.compiled_graphs()
    trainer.step = 1
    trainer.train_iteration()
    after_first = compiling.compiled_graphs()
    trainer.step = 2
    trainer.train_iteration()
    assert after_first > before, "nothing was compiled"
    assert compiling.compiled_graphs() == after_first, "the second iteration recompiled"
    rows = store.read("timings")
    compile_rows = [r for r in rows if r["phase"] == "compile"]
    assert compile_rows and {r["step"] for r in compile_rows} == {1}
    rollout = {r["step"]: r["seconds"] for r in rows if r["phase"] == "rollout"}
    # the first rollout minus its compilation costs what the second does, not the compile's tens of seconds
    assert rollout[1] < sum(r["seconds"] for r in compile_rows)
    engine, nets = trainer.engine, trainer.nets
    with torch.no_grad():  # an update far larger than the tolerance below, then the trainer's refresh
        for p in nets.trainable("old"):
            p.add_(torch.randn_like(p) * 0.05)
    nets.sync_explore_copy()
    ids, texts = ["p0", "p0"], ["a red circle", "a red circle"]
    from solbench.engine.engine import SamplerSpec

    spec = SamplerSpec("euler", cfg.sampling.steps)
    compiled = engine.sample(ids, texts, [0, 1], net="old", sampler=spec, phase="rollout", stream="check").x0
    for block in compiling.repeated_blocks(nets.rollout_copy):
        block._compiled_call_impl = None  # eager from here on
    eager = engine.sample(ids, texts, [0, 1], net="old", sampler=spec, phase="rollout", stream="check").x0
    torch.testing.assert_close(compiled, eager, rtol=1e-4, atol=1e-4)
