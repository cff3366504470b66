"""LoRA role views switch adapters only where needed and leave the shared model as they found it."""

from __future__ import annotations

import pytest
import torch
from peft.tuners.tuners_utils import BaseTunerLayer

from solbench.config import FinetuneConfig, ModelConfig
from solbench.models import build_adapter
from solbench.engine.policy import PolicyNets, _tuner_layers, active_adapter


@pytest.fixture(scope="module")
def nets():
    torch.manual_seed(0)
    adapter = build_adapter(ModelConfig(path="random"))
    return PolicyNets(adapter.transformer, FinetuneConfig(lora_rank=4, lora_alpha=8), {"old", "reference"})


def _state(model):
    layers = _tuner_layers(model)
    return ([(list(m.active_adapters), m.disable_adapters) for m in layers],
            [p.requires_grad for m in layers for p in m.parameters()])


def _count_switches(monkeypatch):
    calls = []
    original = BaseTunerLayer.set_adapter

    def counting(self, *args, **kwargs):
        calls.append(args)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(BaseTunerLayer, "set_adapter", counting)
    return calls


def test_requesting_the_active_adapter_switches_nothing(monkeypatch, nets):
    """Catches: peft's set_adapter (a walk over every adapter's parameters) run on layers that
    are already in the requested state (issue 17: ~1,300 calls per Sol-RL iteration)."""
    calls = _count_switches(monkeypatch)
    before = _state(nets.policy)
    with active_adapter(nets.policy, "default"):
        assert _state(nets.policy)[0] == before[0]
    assert calls == []
    assert _state(nets.policy) == before


@pytest.mark.parametrize("adapter", ["old", None])
def test_switching_runs_the_adapter_and_restores_the_policy(monkeypatch, nets, adapter):
    """Catches: a skipped switch leaving the shared transformer on the wrong adapter (a policy
    forward after an "old" view running the old weights), or the policy's LoRA weights left
    frozen (requires_grad False) after a view ran."""
    layers = _tuner_layers(nets.policy)
    before = _state(nets.policy)
    calls = _count_switches(monkeypatch)
    with active_adapter(nets.policy, adapter, layers):
        inside = [(list(m.active_adapters), m.disable_adapters) for m in layers]
    if adapter is None:
        assert all(disabled for _, disabled in inside)
        assert len(calls) == len(layers)  # only peft's re-enable on the way out
    else:
        assert all(active == [adapter] and not disabled for active, disabled in inside)
        assert len(calls) == 2 * len(layers)  # switch in, switch back: nothing redundant
    assert _state(nets.policy) == before
    assert all(p.requires_grad for p in nets.trainable("policy"))


def test_view_matches_an_explicit_switch(nets):
    """Catches: the view's cached layer list going stale or the view computing another role."""
    torch.manual_seed(1)
    adapter = build_adapter(ModelConfig(path="random"))
    x = torch.randn(2, *adapter.latent_shape)
    t = torch.tensor([0.3, 0.7])
    cond = adapter.encode(["a red circle", "two blue squares"])
    with torch.no_grad():
        for p in nets.trainable("old"):
            p.add_(0.01)
        via_view = adapter.velocity(nets["old"], x, t, cond)
        with active_adapter(nets.policy, "old"):
            explicit = adapter.velocity(nets.policy, x, t, cond)
        policy = adapter.velocity(nets.policy, x, t, cond)
    assert torch.equal(via_view, explicit)
    assert not torch.equal(via_view, policy)
