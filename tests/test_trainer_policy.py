"""PolicyNets: roles as adapter views, gradients only into the policy, merging, checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

from solbench.config import FinetuneConfig, ModelConfig
from solbench.errors import ConfigError
from solbench.models import build_adapter
from solbench.engine.policy import PolicyNets


def identity_explore():
    return (lambda m: copy.deepcopy(m).requires_grad_(False),
            lambda explore, m: explore.load_state_dict(m.state_dict()))


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    adapter = build_adapter(ModelConfig(path="random"))
    base = copy.deepcopy(adapter.transformer)
    factory, sync = identity_explore()
    nets = PolicyNets(adapter.transformer, FinetuneConfig(lora_rank=4, lora_alpha=8), {"old", "reference", "explore"},
                      explore_source="old", explore_factory=factory, explore_sync=sync)
    x = torch.randn(2, *adapter.latent_shape)
    t = torch.tensor([0.5, 0.8])
    cond = adapter.encode(["a red circle", "two blue squares"])
    return adapter, base, nets, x, t, cond


def velocity(setup, role_or_net):
    adapter, _, nets, x, t, cond = setup
    net = nets[role_or_net] if isinstance(role_or_net, str) else role_or_net
    return adapter.velocity(net, x, t, cond)


def test_roles_are_light_views_of_one_lora_model(setup):
    adapter, base, nets, *_ = setup
    assert set(nets) == {"policy", "old", "ema", "reference", "explore"}
    assert nets["old"].parameters().__next__() is nets["policy"].parameters().__next__()
    n_lora = sum(p.numel() for p in nets.trainable("policy"))
    assert n_lora == sum(p.numel() for p in nets.trainable("old")) == sum(p.numel() for p in nets.trainable("ema"))
    assert n_lora < sum(p.numel() for p in base.parameters()) / 10


def test_views_activate_their_adapter_and_gradients_reach_only_the_policy(setup):
    _, base, nets, *_ = setup
    with torch.no_grad():
        for p in nets.trainable("policy"):
            p.add_(0.05 * torch.randn_like(p))
    v_base = velocity(setup, base)
    torch.testing.assert_close(velocity(setup, "reference"), v_base)
    torch.testing.assert_close(velocity(setup, "old"), v_base)  # old still at the initial (B = 0) adapter
    v_policy = velocity(setup, "policy")
    assert (v_policy - v_base).abs().max() > 1e-3
    with torch.no_grad():  # other roles in between must not break the policy's graph
        velocity(setup, "reference")
        velocity(setup, "old")
    v_policy.pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in nets.trainable("policy"))
    assert all(p.grad is None for p in nets.trainable("old"))
    assert all(p.requires_grad for p in nets.trainable("policy"))
    assert not any(p.requires_grad for p in nets.trainable("old") + nets.trainable("ema"))
    for p in nets.trainable("policy"):
        p.grad = None


def test_explore_copy_mirrors_the_merged_source_role(setup):
    _, _, nets, *_ = setup
    with torch.no_grad():
        for old, new in zip(nets.trainable("old"), nets.trainable("policy")):
            old.copy_(new)
    assert not torch.allclose(velocity(setup, "explore"), velocity(setup, "old"), atol=1e-5)
    nets.sync_explore_copy()
    torch.testing.assert_close(velocity(setup, "explore"), velocity(setup, "old"), rtol=0, atol=1e-5)


def test_ema_step_follows_the_reference_warmup(setup):
    _, _, nets, *_ = setup
    nets.ema_updates = 0
    ema_before = [t.clone() for t in nets.trainable("ema")]
    policy = nets.trainable("policy")
    nets.ema_step()  # the first update is n = 1 as in the reference: decay = min(0.9, 2/11)
    for e0, e1, p in zip(ema_before, nets.trainable("ema"), policy):
        torch.testing.assert_close(e1, 2 / 11 * e0 + 9 / 11 * p.detach())
    assert nets.ema_updates == 1
    nets.ema_updates = 79  # the 80th update: (1 + 80) / (10 + 80) = 0.9 (counting from 0 would give 80/89)
    ema_before = [t.clone() for t in nets.trainable("ema")]
    nets.ema_step()
    for e0, e1, p in zip(ema_before, nets.trainable("ema"), policy):
        torch.testing.assert_close(e1, 0.9 * e0 + 0.1 * p.detach())


def test_state_dict_round_trip(setup):
    _, _, nets, *_ = setup
    state = nets.state_dict()
    saved_policy = [t.clone() for t in nets.trainable("policy")]
    with torch.no_grad():
        for p in nets.trainable("policy"):
            p.zero_()
    nets.load_state_dict(state)
    for a, b in zip(nets.trainable("policy"), saved_policy):
        assert torch.equal(a, b)
    with pytest.raises(ConfigError, match="finetune.mode='full'"):
        nets.load_state_dict({**state, "mode": "full"})


def test_unknown_lora_targets_fail_clearly():
    adapter = build_adapter(ModelConfig(path="random"))
    with pytest.raises((ConfigError, ValueError), match="to_qq|match"):
        PolicyNets(adapter.transformer, FinetuneConfig(lora_targets=["to_qq"]), set())
