"""The real path's training state on a bf16 base, and what building the explore copy costs.

On CUDA the transformer runs in bf16; the CPU tests run fp32 and could not see dtype bugs. These
tests build the tiny model in bf16 on CPU (the same classes, peft and quantizer code as on a GPU)
and count memory with solbench.measure.peak.PeakMemory. Each test names the bug it catches.
"""

from __future__ import annotations

import pytest
import torch

from solbench import quant
from solbench.config import FinetuneConfig, ModelConfig
from solbench.measure.peak import PeakMemory
from solbench.models import build_adapter
from solbench.engine.policy import PolicyNets

ROLES = {"old", "reference"}


def _bf16_nets(roles=ROLES, **kw):
    torch.manual_seed(0)
    adapter = build_adapter(ModelConfig(path="random", full_dtype="bf16"))
    nets = PolicyNets(adapter.transformer, FinetuneConfig(lora_rank=4, lora_alpha=8), roles, **kw)
    return adapter, nets


def _loss(adapter, nets):
    torch.manual_seed(1)
    x = torch.randn(4, *adapter.latent_shape)
    cond = adapter.encode(["two red circles", "a blue square", "a green triangle", "one red square"])
    v = adapter.velocity(nets["policy"], x, torch.full((4,), 0.6), cond)
    return (v.float() - x).pow(2).mean()


def test_lora_parameters_gradients_and_adamw_state_are_fp32_on_a_bf16_base():
    """Bug: peft's inject_adapter_in_model gives each adapter its base layer's dtype (the fp32 upcast
    runs only in PeftModel.__init__), so on a bf16 transformer the adapters, their gradients and
    AdamW's moments were bf16: v * 0.999 rounds back to v in bf16 (the second moment never decays)."""
    adapter, nets = _bf16_nets()
    base = [p for n, p in adapter.transformer.named_parameters() if "lora_" not in n]
    assert base and all(p.dtype == torch.bfloat16 for p in base)  # the base stays bf16 (memory)
    for role in ("policy", "old", "ema"):
        assert all(p.dtype == torch.float32 for p in nets.trainable(role)), role
    params = nets.trainable("policy")
    _loss(adapter, nets).backward()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in params)
    assert any(p.grad.abs().sum() > 0 for p in params)
    optimizer = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), weight_decay=1e-4)
    optimizer.step()
    state = [optimizer.state[p] for p in params]
    assert all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in state)
    # the second moment decays by 0.999 on a step with zero gradient (in bf16 it stayed put)
    before = [s["exp_avg_sq"].clone() for s in state]
    for p in params:
        p.grad.zero_()
    optimizer.step()
    moved = [(s["exp_avg_sq"], b) for s, b in zip(state, before) if b.abs().max() > 0]
    assert moved and all(torch.equal(v, b * 0.999) for v, b in moved)


def test_ema_and_old_policy_lerps_run_in_fp32():
    """Bug: with bf16 adapters the EMA (decay 0.9 after warm-up) and the old-policy lerp lost their small
    terms to bf16 rounding; in fp32 a lerp toward the policy moves every adapter weight by 1 - decay."""
    from solbench.method import ema_into_role

    _, nets = _bf16_nets()
    with torch.no_grad():
        for p in nets.trainable("policy"):
            p.add_(1e-3)  # a small update, as one optimizer step makes
        expected_old = [o + 0.1 * (p - o) for o, p in zip(nets.trainable("old"), nets.trainable("policy"))]
        ema_into_role(nets, "old", 0.9)
        for got, want in zip(nets.trainable("old"), expected_old):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)
        ema_before = [e.clone() for e in nets.trainable("ema")]
        nets.ema_step()  # warm-up decay min(0.9, 2/11)
        decay = 2 / 11
        for got, before, p in zip(nets.trainable("ema"), ema_before, nets.trainable("policy")):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, before + (1 - decay) * (p - before), rtol=1e-6, atol=1e-9)


def test_explore_copy_is_built_without_gradients():
    """Bug: PolicyNets built the explore copy with gradients enabled; TransformerEngine's layers then
    keep a columnwise copy of each quantized weight for a backward that never comes (FLUX: 13.1 GB
    instead of 6.6). The factory must run under no_grad."""
    seen = []

    def factory(module):
        seen.append(torch.is_grad_enabled())
        return quant.quantized_copy(module, "nvfp4_tiny")

    _bf16_nets(ROLES | {"explore"}, explore_source="old", explore_factory=factory, explore_sync=quant.sync_weights)
    assert seen == [False]


@pytest.mark.parametrize("backend", ["emulated", "torch"])
def test_quantized_copy_makes_no_full_size_transient_copy(backend):
    """Bug: quantized_copy deep-copied every Linear in bf16 before swapping the quantized ones for
    their low-precision layers: a transient second transformer (+23 GB on FLUX). Built under
    PeakMemory on a bf16 model with LoRA, the copy's peak is what it keeps plus about one layer,
    and on the scaled-matmul backend what it keeps of each quantized weight is its FP8 codes."""
    recipe = quant.get_recipe("fp8_w8a8").replace(skip=("proj_out", "*.proj_out"))
    adapter, nets = _bf16_nets({"old"})
    source = nets["policy"]
    with torch.no_grad(), PeakMemory("cpu") as peak:
        copy = quant.quantized_copy(source, recipe, backend=backend)
    quantized = sum(r.in_features * r.out_features * 2 for r in quant.quantization_summary(copy) if r.quantized)
    kept = sum(t.numel() * t.element_size() for t in list(copy.parameters()) + list(copy.buffers())
               if t.untyped_storage().data_ptr() not in {p.untyped_storage().data_ptr() for p in source.parameters()})
    largest = max(m.weight.numel() * m.weight.element_size() for m in source.modules() if isinstance(m, torch.nn.Linear))
    assert quantized > 10 * largest  # many layers: a copy of them all would stand out
    # kept + a few layers' worth: one merged weight at a time, and the eager quantizer's scratch
    # buffers (a bounded per-process pool; the old deep copy added every quantized weight, 16x the largest)
    assert peak.bytes <= kept + 8 * largest, (peak.bytes, kept, largest)
    if backend == "torch":  # one byte per quantized weight (plus scales), no bf16 shadow
        rows = [r for r in quant.quantization_summary(copy) if r.quantized]
        assert kept < sum(r.in_features * r.out_features for r in rows) * 1.2 + quantized / 2
