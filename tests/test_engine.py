"""The rollout engine on the tiny model: noise identity, exact log-prob recompute, timing rows."""

import copy

import pytest
import torch

from solbench.config import ModelConfig
from solbench.engine.engine import Engine, Rollout, SamplerSpec, precision_of
from solbench.errors import ConfigError
from solbench.models import build_adapter
from solbench.quant import get_recipe, quantized_copy
from solbench.engine.timing import PhaseTimer

PROMPTS = ["three red circles", "a blue square and a green circle", "two yellow squares", "one green circle"]


def mean_brightness(images, prompts):
    score = images.mean(dim=(1, 2, 3))
    return score, {"brightness": score}


@pytest.fixture(scope="module")
def adapter():
    return build_adapter(ModelConfig(name="tiny", path="random"))


@pytest.fixture(scope="module")
def nets(adapter):
    return {"policy": adapter.transformer, "explore": quantized_copy(adapter.transformer, "nvfp4_tiny")}


def make_engine(adapter, nets, timer=None):
    return Engine(adapter, nets, mean_brightness, timer or PhaseTimer(), run_seed=3,
                  explore_recipe=get_recipe("nvfp4_tiny"))


def group(n, prompt_index=0):
    return [f"p{prompt_index}"] * n, [PROMPTS[prompt_index]] * n, list(range(n))


def test_regenerating_a_candidate_alone_is_bit_identical(adapter, nets):
    engine = make_engine(adapter, nets)
    ids = [f"p{i % 4}" for i in range(8)]
    prompts = [PROMPTS[i % 4] for i in range(8)]
    spec = SamplerSpec("euler", 3)
    batch = engine.sample(ids, prompts, list(range(8)), sampler=spec, phase="explore", stream="train/0")
    for i in (0, 5):
        alone = engine.sample([ids[i]], [prompts[i]], [i], sampler=spec, phase="regenerate", stream="train/0")
        assert torch.equal(alone.x0[0], batch.x0[i])
        assert alone.noise_seeds == [batch.noise_seeds[i]]
    reordered = engine.sample(ids[::-1], prompts[::-1], list(range(8))[::-1], sampler=spec, phase="rollout",
                              stream="train/0")
    assert torch.equal(reordered.x0, batch.x0.flip(0))


def test_explore_rollouts_differ_from_full_but_stay_close(adapter, nets):
    engine = make_engine(adapter, nets)
    ids, prompts, cands = group(4)
    spec = SamplerSpec("euler", 3)
    full = engine.sample(ids, prompts, cands, sampler=spec, phase="rollout", stream="train/1")
    low = engine.sample(ids, prompts, cands, net="explore", sampler=spec, phase="explore", stream="train/1")
    assert (full.precision, low.precision) == ("full", "explore")
    assert (full.dtype, low.dtype) == ("float32", "nvfp4_tiny(float32)")
    assert not torch.equal(full.x0, low.x0)
    rel = ((full.x0 - low.x0).norm() / full.x0.norm()).item()
    assert 0 < rel < 0.25
    # a candidate explored in low precision regenerates from the same initial noise
    assert low.noise_seeds == full.noise_seeds


@pytest.mark.parametrize("kind,level,guidance", [("flowgrpo_sde", 0.7, None), ("flowgrpo_cps", 0.5, None),
                                                 ("dance_sde", 0.3, 2.0)])
def test_on_policy_log_prob_recompute_gives_ratio_exactly_one(adapter, nets, kind, level, guidance):
    engine = make_engine(adapter, nets)
    ids = ["p0", "p0", "p1", "p2", "p3"]
    prompts = [PROMPTS[0], PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[3]]
    rollout = engine.sample(ids, prompts, [0, 1, 0, 0, 0], sampler=SamplerSpec(kind, 3, level, guidance=guidance),
                            phase="rollout", stream="train/2", keep_trajectory=True)
    stored = rollout.trajectory.log_probs
    assert stored.shape == (5, 3) and stored.dtype == torch.float32
    for j in range(3):
        recomputed = engine.log_prob("policy", rollout, j)
        assert torch.equal(recomputed.log_prob, stored[:, j])
        assert torch.equal(torch.exp(recomputed.log_prob - stored[:, j]), torch.ones(5))
    # a training micro-batch of a subset recomputes the same numbers
    sub = engine.log_prob("policy", rollout, 1, idx=[3, 0])
    assert torch.equal(sub.log_prob, stored[[3, 0], 1])
    # and a different network gives a different density
    assert not torch.equal(engine.log_prob("explore", rollout, 1).log_prob, stored[:, 1])


def test_log_prob_gradients_flow_to_the_policy(adapter, nets):
    engine = make_engine(adapter, nets)
    ids, prompts, cands = group(4, 2)
    rollout = engine.sample(ids, prompts, cands, sampler=SamplerSpec("flowgrpo_sde", 2, 0.7), phase="rollout",
                            stream="train/3", keep_trajectory=True)
    policy = nets["policy"]
    policy.zero_grad()
    engine.log_prob("policy", rollout, 0).log_prob.sum().backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    policy.zero_grad()
    with pytest.raises(ValueError, match="deterministic"):
        det = engine.sample(ids, prompts, cands, sampler=SamplerSpec("euler", 2), phase="rollout", stream="s",
                            keep_trajectory=True)
        engine.log_prob("policy", det, 0)


def test_stochastic_rollouts_are_reproducible_and_shared_noise_groups_diverge(adapter, nets):
    engine = make_engine(adapter, nets)
    ids, prompts, cands = group(4, 1)
    spec = SamplerSpec("dance_sde", 3, 0.3)
    a = engine.sample(ids, prompts, cands, sampler=spec, phase="rollout", stream="train/4", noise_idx=[0] * 4,
                      keep_trajectory=True)
    b = engine.sample(ids, prompts, cands, sampler=spec, phase="rollout", stream="train/4", noise_idx=[0] * 4)
    assert torch.equal(a.x0, b.x0)
    assert len(set(a.noise_seeds)) == 1  # DanceGRPO: one initial noise for the whole group
    assert torch.equal(a.trajectory.xs[0, 0], a.trajectory.xs[3, 0])
    assert not torch.equal(a.x0[0], a.x0[3])  # but independent SDE noise per candidate


def test_training_velocity_calls_count_their_flops_toward_the_train_phase(adapter):
    """Catches: the train phase carrying no FLOPs (the projected clock then leaves training out and
    overstates Sol-RL's end-to-end speedup), a backward counted for no-grad calls, CFG's second
    forward forgotten, or LoRA's backward charged like full fine-tuning's."""
    from solbench.config import FinetuneConfig
    from solbench.engine.policy import PolicyNets

    per_forward = adapter.flops_per_forward()
    x = torch.zeros(3, *adapter.latent_shape)
    t = torch.full((3,), 0.5)
    expected = {}
    for mode, backward in (("lora", 1), ("full", 2)):
        import copy

        nets = PolicyNets(copy.deepcopy(adapter.transformer), FinetuneConfig(mode=mode, lora_rank=4, lora_alpha=8),
                          roles=("old",))
        timer = PhaseTimer()
        engine = make_engine(adapter, nets, timer)
        cond = engine.encode(["a red square"] * 3)
        with engine.phase("train", precision="full"):
            with torch.no_grad():
                engine.velocity("old", x, t, cond)  # the old policy's target: forward only
            engine.velocity("policy", x, t, cond, guidance=2.0).sum()  # CFG: two forwards, with gradients
        engine.velocity("policy", x, t, cond)  # outside any phase: counted nowhere
        (row,) = [r.row() for r in timer.drain()]
        expected[mode] = per_forward * 3 * (1 + 2 * (1 + backward))
        assert row["phase"] == "train" and row["flops"] == pytest.approx(expected[mode])
    assert expected["full"] > expected["lora"]


def test_timing_rows_and_scores(adapter, nets):
    timer = PhaseTimer()
    engine = make_engine(adapter, nets, timer)
    ids, prompts, cands = group(4, 3)
    rollout = engine.sample(ids, prompts, cands, net="explore", sampler=SamplerSpec("euler", 2, guidance=2.0),
                            phase="explore", stream="eval")
    scores = engine.score(rollout)
    with engine.phase("select"):
        pass
    rows = [r.row() for r in timer.drain()]
    assert [(r["phase"], r["precision"], r["n_images"]) for r in rows] == [
        ("explore", "explore", 4), ("reward", "explore", 4), ("select", "", 0)]
    per_forward = adapter.flops_per_forward()
    assert rows[0]["flops"] == pytest.approx(per_forward * 4 * 2 * 2)  # images x steps x CFG forwards
    assert all(r["seconds"] > 0 for r in rows[:2])
    torch.testing.assert_close(scores, rollout.images.mean(dim=(1, 2, 3)))
    assert set(rollout.reward_parts) == {"brightness"}
    assert rollout.images.shape == (4, 3, 32, 32) and 0 <= rollout.images.min() and rollout.images.max() <= 1


def test_rollout_index_and_cat(adapter, nets):
    engine = make_engine(adapter, nets)
    ids, prompts, cands = group(4)
    spec = SamplerSpec("flowgrpo_sde", 2, 0.7)
    r = engine.sample(ids, prompts, cands, sampler=spec, phase="rollout", stream="train/5", keep_trajectory=True)
    engine.score(r)
    picked = r.index([3, 1])
    assert picked.cand_idx == [3, 1] and picked.noise_seeds == [r.noise_seeds[3], r.noise_seeds[1]]
    assert torch.equal(picked.x0, r.x0[[3, 1]]) and torch.equal(picked.rewards, r.rewards[[3, 1]])
    assert torch.equal(picked.trajectory.log_probs, r.trajectory.log_probs[[3, 1]])
    masked = r.index(torch.tensor([True, False, False, True]))
    assert masked.cand_idx == [0, 3]
    joined = Rollout.cat([r.index([0, 1]), r.index([2, 3])])
    assert joined.cand_idx == r.cand_idx and torch.equal(joined.x0, r.x0)
    assert torch.equal(joined.trajectory.xs, r.trajectory.xs) and torch.equal(joined.rewards, r.rewards)
    other = engine.sample(ids, prompts, cands, sampler=SamplerSpec("euler", 2), phase="rollout", stream="s")
    with pytest.raises(ValueError, match="differ"):
        Rollout.cat([r, other])


def test_micro_batches_give_the_same_rollout(adapter, nets):
    ids = [f"p{i % 4}" for i in range(6)]
    prompts = [PROMPTS[i % 4] for i in range(6)]
    spec = SamplerSpec("awm_sde", 2, 0.5)
    whole = make_engine(adapter, nets).sample(ids, prompts, range(6), sampler=spec, phase="rollout", stream="t",
                                              keep_trajectory=True)
    chunked = Engine(adapter, nets, mean_brightness, PhaseTimer(), run_seed=3, micro_batch=4).sample(
        ids, prompts, range(6), sampler=spec, phase="rollout", stream="t", keep_trajectory=True)
    assert torch.equal(whole.x0, chunked.x0)
    assert torch.equal(whole.trajectory.log_probs, chunked.trajectory.log_probs)


def test_roles_and_errors(adapter, nets):
    engine = make_engine(adapter, nets)
    assert precision_of("explore") == "explore" and precision_of("ema") == "full"
    with pytest.raises(ConfigError, match="no network for role 'ema'"):
        engine.sample(["p"], ["x"], [0], net="ema", sampler=SamplerSpec("euler", 1), phase="eval", stream="eval")
    with pytest.raises(ValueError, match="one entry per sample"):
        engine.sample(["p", "q"], ["x"], [0], sampler=SamplerSpec("euler", 1), phase="eval", stream="eval")
    lazy = {"policy": nets["policy"]}
    engine = make_engine(adapter, lazy)
    lazy["ema"] = nets["explore"]  # roles are looked up on every call
    assert engine.net("ema") is nets["explore"]


def test_sync_explore_copy_requantizes_from_the_policy(adapter):
    policy = copy.deepcopy(adapter.transformer)
    nets = {"policy": policy, "explore": quantized_copy(policy, "nvfp4_tiny")}
    timer = PhaseTimer()
    engine = make_engine(adapter, nets, timer)
    ids, prompts, cands = group(4, 1)
    spec = SamplerSpec("euler", 2)
    before = engine.sample(ids, prompts, cands, net="explore", sampler=spec, phase="explore", stream="e")
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(1.05)
    engine.sync_explore_copy()
    after = engine.sample(ids, prompts, cands, net="explore", sampler=spec, phase="explore", stream="e")
    assert not torch.equal(before.x0, after.x0)
    fresh = make_engine(adapter, {"policy": policy, "explore": quantized_copy(policy, "nvfp4_tiny")})
    again = fresh.sample(ids, prompts, cands, net="explore", sampler=spec, phase="explore", stream="e")
    assert torch.equal(after.x0, again.x0)  # sync == re-quantizing from scratch
    assert [r.phase for r in timer.drain()] == ["explore", "sync", "explore"]
