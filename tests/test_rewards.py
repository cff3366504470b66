"""Reward registry, RewardSet and the prompt-independent image statistics."""

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from solbench import rewards
from solbench.errors import ConfigError
from solbench.rewards.image_stats import colorfulness, jpeg_sizes_kb
from solbench.world import grammar, scenes

BUILTIN = ["shapes_geneval", "shapes_geneval_strict", "shapes_clip", "jpeg_compressibility",
           "jpeg_incompressibility", "colorfulness"]


def _scenes(n=6, seed=0):
    rng = np.random.default_rng(seed)
    reqs = [grammar.sample_requirements(rng) for _ in range(n)]
    return scenes.render_batch([grammar.sample_scene(r, rng) for r in reqs]), [grammar.caption(r) for r in reqs]


def test_registry_lists_builtin_and_real_rewards():
    names = rewards.names()
    for name in BUILTIN + ["pickscore", "imagereward", "hpsv2", "clipscore"]:
        assert name in names
    assert names == sorted(names)


def test_unknown_reward_suggests_close_matches():
    with pytest.raises(ConfigError, match=r"unknown reward 'shapes_genval'.*Did you mean 'shapes_geneval'"):
        rewards.get("shapes_genval")
    with pytest.raises(ConfigError, match="Known rewards: .*colorfulness"):
        rewards.get("zzzz")


def test_registering_a_name_twice_fails():
    with pytest.raises(ValueError, match="already registered"):
        rewards.register("colorfulness", lambda device=None: None)


@pytest.mark.parametrize("name", [n for n in BUILTIN if n != "shapes_clip"])
def test_rewards_follow_the_contract(name):
    reward = rewards.get(name)
    images, prompts = _scenes()
    scores = reward(images.double(), prompts)  # any float input dtype
    assert isinstance(reward, rewards.Reward)
    assert reward.name == name and reward.higher_is_better is True
    lo, hi = reward.range
    assert scores.dtype == torch.float32 and scores.shape == (6,) and scores.device.type == "cpu"
    assert bool(((scores >= lo) & (scores <= hi)).all())


def test_reward_set_is_the_weighted_sum_of_its_parts():
    images, prompts = _scenes()
    rs = rewards.RewardSet({"shapes_geneval": 1.0, "colorfulness": 0.5, "jpeg_compressibility": -2.0})
    total, parts = rs(images, prompts)
    assert set(parts) == {"shapes_geneval", "colorfulness", "jpeg_compressibility"}
    expected = parts["shapes_geneval"] + 0.5 * parts["colorfulness"] - 2.0 * parts["jpeg_compressibility"]
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(parts["colorfulness"], colorfulness(images))
    with pytest.raises(ConfigError, match="at least one reward"):
        rewards.RewardSet({})


def test_jpeg_size_matches_pil_and_ranks_flat_above_noisy():
    gen = torch.Generator().manual_seed(0)
    flat = torch.full((1, 3, 32, 32), 0.3)
    noisy = torch.rand((1, 3, 32, 32), generator=gen)
    images = torch.cat([flat, noisy])
    arr = (noisy[0].permute(1, 2, 0) * 255).round().to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=95)
    assert jpeg_sizes_kb(images)[1].item() == pytest.approx(buf.tell() / 1000)
    comp = rewards.get("jpeg_compressibility")(images, ["", ""])
    incomp = rewards.get("jpeg_incompressibility")(images, ["", ""])
    assert comp[0] > comp[1] and incomp[1] > incomp[0]
    torch.testing.assert_close(comp, -incomp)


def test_colorfulness_hand_computed():
    grey = torch.full((1, 3, 8, 8), 0.5)
    half = torch.zeros(1, 3, 8, 8)
    half[0, 0, :, :4] = 1.0  # left half pure red
    half[0, 1, :, 4:] = 1.0  # right half pure green
    # rg = +1 / -1: mean 0, sd 1; yb = 0.5 everywhere: mean 0.5, sd 0 -> 1 + 0.3 * 0.5.
    values = colorfulness(torch.cat([grey, half]))
    assert values[0].item() == pytest.approx(0.0, abs=1e-6)
    assert values[1].item() == pytest.approx(1.15, abs=1e-5)
    assert values[1].item() <= rewards.get("colorfulness").range[1]


def test_shapes_rewards_reject_prompts_outside_the_grammar():
    images, _ = _scenes(1)
    with pytest.raises(grammar.PromptParseError):
        rewards.get("shapes_geneval")(images, ["a photo of a cat"])


def test_rewards_accept_other_devices_and_return_cpu():
    # "meta" cannot hold data; use whatever non-default device exists, else a non-contiguous CPU view.
    images, prompts = _scenes(4)
    view = images.permute(0, 1, 3, 2).transpose(2, 3)  # same values, non-contiguous
    for name in ("shapes_geneval", "colorfulness", "jpeg_compressibility"):
        r = rewards.get(name)
        torch.testing.assert_close(r(view, prompts), r(images, prompts))
    assert not math.isnan(rewards.get("shapes_geneval")(images, prompts).sum().item())
