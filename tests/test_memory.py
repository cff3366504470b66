"""What a rank keeps in memory: one full-precision transformer, a bounded prompt cache, encoders
loaded once per encode under cpu_offload, and SANA's flow_shift schedule.

Each test names the bug it catches.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solbench import quant
from solbench.config import FinetuneConfig, ModelConfig
from solbench.models import build_adapter
from solbench.models.base import shifted_sigmas
from solbench.engine.policy import PolicyNets


def _storages(*modules: nn.Module) -> dict[int, torch.Tensor]:
    out = {}
    for m in modules:
        for t in list(m.parameters()) + list(m.buffers()):
            out.setdefault(t.untyped_storage().data_ptr(), t)
    for m in modules:  # tensors kept as plain attributes (quantized layers' weights)
        for sub in m.modules():
            for v in vars(sub).values():
                if isinstance(v, torch.Tensor):
                    out.setdefault(v.untyped_storage().data_ptr(), v)
    return out


def test_explore_copy_keeps_no_full_precision_merge_target():
    """Bug: PolicyNets deep-copied the transformer as a merge target for the explore copy, a third
    full-precision transformer per rank (24 GB on FLUX). The nets must hold one full-precision copy of
    each quantized weight (the policy's) and the explore copy's quantized form."""
    torch.manual_seed(0)
    adapter = build_adapter(ModelConfig(path="random"))
    recipe = quant.get_recipe("nvfp4_tiny")
    nets = PolicyNets(adapter.transformer, FinetuneConfig(lora_rank=4, lora_alpha=8), {"old", "reference", "explore"},
                      explore_source="old", explore_factory=lambda m: quant.quantized_copy(m, recipe),
                      explore_sync=quant.sync_weights)
    rows = [r for r in quant.quantization_summary(nets["explore"]) if r.quantized]
    assert rows, "the tiny recipe quantizes some layers"
    held = _storages(nets["policy"], nets["explore"], *[v for v in vars(nets).values() if isinstance(v, nn.Module)])
    base_weight = dict(nets.policy.named_parameters())
    for row in rows:
        name = next(k for k in base_weight if k in (f"{row.name}.weight", f"{row.name}.base_layer.weight"))
        shape = base_weight[name].shape
        same = [t for t in held.values() if t.shape == shape and t.is_floating_point() and t.dtype == base_weight[name].dtype
                and torch.equal(t, base_weight[name])]
        assert len(same) == 1, f"{row.name}: {len(same)} full-precision copies of its weight"
    assert not any(isinstance(v, nn.Module) and v is not nets.policy for v in vars(nets).values())
    # and the copy still mirrors the old policy's merged weights after a sync
    with torch.no_grad():
        for p in nets.trainable("old"):
            p.add_(0.05)
    nets.sync_explore_copy()
    fresh = quant.quantized_copy(nets._merged_module(), recipe)
    x = torch.randn(2, *adapter.latent_shape)
    t = torch.tensor([0.3, 0.7])
    cond = adapter.encode(["a red circle", "two blue squares"])
    torch.testing.assert_close(adapter.velocity(nets["explore"], x, t, cond), adapter.velocity(fresh, x, t, cond),
                               rtol=0, atol=1e-6)


def test_prompt_cache_is_a_bounded_lru_with_the_same_numbers():
    """Bug: the prompt-embedding cache grew without bound on the GPU (~8 MB per FLUX prompt)."""
    adapter = build_adapter(ModelConfig(path="random"))
    adapter.cond_cache_size = 2
    calls = []
    encode = adapter._encode_batch
    adapter._encode_batch = lambda prompts: calls.append(list(prompts)) or encode(prompts)
    first = adapter.encode(["a", "b"])
    adapter.encode(["a"])  # a is now the most recent
    adapter.encode(["c"])  # evicts b
    assert list(adapter._cond_cache) == ["a", "c"] and calls == [["a"], ["b"], ["c"]]
    again = adapter.encode(["b", "a"])  # b re-encoded, a from the cache
    assert calls[-1] == ["b"] and len(adapter._cond_cache) == 2
    for name in first.tensors:
        assert torch.equal(again[name][0], first[name][1]) and torch.equal(again[name][1], first[name][0])


def test_prompt_cache_on_another_device_returns_conditioning_on_the_adapter_device(monkeypatch):
    """With ``cond_cache_device`` (host memory on CUDA machines) entries are stored there and every
    encode returns conditioning moved to the adapter's device, the same numbers as without it."""
    from solbench.models.base import Cond

    plain = build_adapter(ModelConfig(path="random")).encode(["a", "b", "a"])
    adapter = build_adapter(ModelConfig(path="random"))
    adapter.cond_cache_device = torch.device("cpu")
    moves = []
    original = Cond.to
    monkeypatch.setattr(Cond, "to", lambda self, device=None, dtype=None: moves.append(str(device)) or
                        original(self, device, dtype))
    cond = adapter.encode(["a", "b", "a"])
    assert moves == ["cpu", "cpu", str(adapter.device)]  # two entries stored, one batch returned
    for name in plain.tensors:
        assert torch.equal(cond[name], plain[name])


def test_cpu_offload_loads_the_text_encoders_once_per_encode(monkeypatch):
    """Bug: with cpu_offload every text encoder went to the GPU and back for each prompt."""
    from test_models_diffusers import flux_components

    from solbench.models.flux import FluxAdapter

    adapter = FluxAdapter.from_components(**flux_components(), resolution=32, max_sequence_length=16, cpu_offload=True)
    moves = []
    for enc in adapter._text_encoders():
        original = enc.to

        def spy(*args, _orig=original, _enc=enc, **kwargs):
            moves.append((type(_enc).__name__, str(args[0]) if args else str(kwargs)))
            return _orig(*args, **kwargs)
        monkeypatch.setattr(enc, "to", spy)
    adapter.encode(["a red cube", "two blue balls", "a green cone"])
    per_encoder = {}
    for name, _ in moves:
        per_encoder[name] = per_encoder.get(name, 0) + 1
    assert per_encoder and all(n == 2 for n in per_encoder.values()), moves  # on once, off once, for 3 prompts
    assert adapter._resident == set()


def test_sana_schedule_uses_the_schedulers_flow_shift():
    """SANA's diffusers checkpoints carry a DPM-Solver scheduler with ``flow_shift`` (no ``shift``):
    the adapter must take its default shift from it, not fall back to 1."""
    from diffusers import DPMSolverMultistepScheduler
    from test_models_diffusers import sana_components

    from solbench.models.sana import SanaAdapter

    parts = sana_components()
    parts["scheduler"] = DPMSolverMultistepScheduler(flow_shift=3.0, use_flow_sigmas=True,
                                                     prediction_type="flow_prediction")
    adapter = SanaAdapter.from_components(**parts, resolution=32, max_sequence_length=8)
    assert adapter.default_shift == 3.0
    torch.testing.assert_close(adapter.sigmas(4), shifted_sigmas(4, 3.0))
    assert not torch.allclose(adapter.sigmas(4), shifted_sigmas(4, 1.0))
    # the shifted schedule is the pipeline scheduler's own: sigma' = s * sigma / (1 + (s - 1) * sigma)
    sigma = torch.tensor(0.5)
    assert float(adapter.sigmas(2)[1]) == pytest.approx(float(3 * sigma / (1 + 2 * sigma)), abs=1e-6)
