"""Row invariance on CPU: a row's result must not depend on the rows computed beside it.

These tests fail on CPUs whose GEMM kernels change with the row count (measured on an Intel
Sapphire Rapids: the modulation layers' M = batch rows differ below M = 11) unless the harness pads.
They assert bit-identity where padding to 16+ rows makes the GEMM row-invariant (Intel MKL on Intel
CPUs, an AMD EPYC Zen 4); with MKL's AVX2 kernels padding is not enough and they compare up to
float32 rounding (tests/_cpu.py).
"""

import pytest
import torch
from torch import nn

from _cpu import ATOL, RTOL, assert_same_numbers, gemm_rows_invariant, one_thread
from solbench.models.batch_invariance import pad_linear_rows
from solbench.models.tiny import load_tiny
from solbench.models.tiny_adapter import TinyAdapter
from solbench.quant import quantized_copy


@pytest.fixture(autouse=True)
def _the_runs_thread_count():
    # every run and rank computes on its numerics.threads (default 1): the guarantee is at one count
    with one_thread():
        yield


def _rows_alone_and_in_batches(layer: nn.Module, x: torch.Tensor) -> list[bool]:
    """For every prefix length m: do rows 0..m-1 computed as a batch equal each row computed alone?"""
    alone = torch.cat([layer(x[i:i + 1]) for i in range(len(x))])
    same = torch.equal if gemm_rows_invariant() else lambda a, b: torch.allclose(a, b, rtol=RTOL, atol=ATOL)
    return [same(layer(x[:m]), alone[:m]) for m in range(1, len(x) + 1)]


def test_padded_linear_rows_agree_whatever_batch_they_are_computed_in():
    torch.manual_seed(0)
    for k, n in [(256, 128), (128, 768), (64, 128), (640, 128)]:
        layer = nn.Linear(k, n)
        x = torch.randn(24, k)
        with torch.no_grad(), pad_linear_rows():
            assert all(_rows_alone_and_in_batches(layer, x)), (k, n)


def test_padding_keeps_shapes_values_and_gradients_and_goes_away_after_the_block():
    torch.manual_seed(0)
    layer = nn.Linear(32, 8)
    x = torch.randn(2, 3, 32, requires_grad=True)  # 6 rows, padded to 16 inside
    with pad_linear_rows():
        y = layer(x)
    assert y.shape == (2, 3, 8)
    torch.testing.assert_close(y, torch.nn.functional.linear(x, layer.weight, layer.bias))
    y.sum().backward()
    torch.testing.assert_close(x.grad, layer.weight.sum(0).expand(2, 3, 32))
    assert layer.weight.grad.shape == (8, 32)
    seen = []
    handle = layer.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    with pad_linear_rows():
        layer(torch.randn(5, 32))
    layer(torch.randn(5, 32))
    handle.remove()
    assert seen == [(16, 32), (5, 32)]  # padded inside the block only


def test_quantized_copies_are_padded_too():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    explore = quantized_copy(model, "nvfp4_w4a16")
    x = torch.randn(12, 64)
    with torch.no_grad(), pad_linear_rows():
        assert all(_rows_alone_and_in_batches(explore, x))


def test_a_prompt_is_conditioned_on_the_same_numbers_whichever_prompts_are_encoded_with_it():
    texts = ["a red circle left of a blue square", "three green triangles", "a yellow square"]
    together = TinyAdapter(load_tiny(pretrained=True)).encode(texts)
    for i, text in enumerate(texts):
        alone = TinyAdapter(load_tiny(pretrained=True)).encode([text])
        for name in ("tokens", "pooled"):
            assert torch.equal(alone[name], together[name][i:i + 1]), (text, name)


def test_the_tiny_model_gives_a_sample_the_same_velocity_in_any_batch():
    torch.manual_seed(0)
    adapter = TinyAdapter(load_tiny(pretrained=True))
    texts = ["two red circles", "a blue square", "three green triangles"] * 4
    cond = adapter.encode(texts)
    x, t = torch.randn(len(texts), *adapter.latent_shape), torch.rand(len(texts))
    with torch.no_grad(), pad_linear_rows():
        batch = adapter.velocity(adapter.transformer, x, t, cond)
        for i in range(len(texts)):
            # four copies of one sample: the row count the engine pads a single candidate to on CPU
            alone = adapter.velocity(adapter.transformer, x[[i] * 4], t[[i] * 4], cond.index([i] * 4))[:1]
            assert_same_numbers(alone, batch[i:i + 1], f"sample {i}")


def test_a_prompt_is_encoded_to_the_same_numbers_in_any_batch():
    # Bug caught: the tiny text encoder's fused nn.TransformerEncoderLayer path calls its projections
    # as functions, out of reach of pad_linear_rows' module hooks, so one prompt ran its GEMMs on 10
    # rows, where AMD EPYC's MKL kernel gives other bits than on a padded row count: a rank holding one
    # prompt conditioned on other numbers than a process holding three (issue 22).
    model = load_tiny(pretrained=True)
    texts = ["a red circle left of a blue square", "three green triangles", "a yellow square"]
    alone = [model.encode([text]) for text in texts]
    together = model.encode(texts)
    for i, text in enumerate(texts):
        for part in (0, 1):  # token states, pooled
            assert_same_numbers(together[part][i:i + 1], alone[i][part], f"{text!r} part {part}: in a batch")


def test_an_image_gets_the_same_reward_in_any_scoring_batch():
    # Bug caught: reward models ran outside the engine's row padding, so the tiny CLIP scored an
    # image with other bits depending on how many images shared its call (and on the thread count):
    # a sharded rollout, a resumed run or another reward_micro_batch changed the rewards.
    from solbench.engine.engine import Engine, Rollout, SamplerSpec
    from solbench.rewards import RewardSet
    from solbench.engine.timing import PhaseTimer

    adapter = TinyAdapter(load_tiny(pretrained=True))
    rewards = RewardSet({"shapes_clip": 1.0}, "cpu")
    images = torch.rand(7, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["two red circles", "a blue square", "three green triangles", "a yellow circle", "a red square",
               "a green circle left of a blue square", "four yellow triangles"]
    n = len(prompts)
    rollout = Rollout(prompt_ids=[str(i) for i in range(n)], prompts=prompts, cand_idx=[0] * n, noise_seeds=[0] * n,
                      precision="full", dtype="float32", x0=images * 2 - 1, images=images,
                      sampler=SamplerSpec("euler", 1))
    scores = {}
    for chunk in (1, 3, 7):
        engine = Engine(adapter, {"policy": adapter.transformer}, rewards, PhaseTimer(), run_seed=0,
                        reward_micro_batch=chunk)
        scores[chunk] = engine.score_with(rewards, rollout)[0]
    assert_same_numbers(scores[3], scores[7], "rewards scored 3 at a time vs all 7 together")
    assert_same_numbers(scores[1], scores[7], "rewards scored one by one vs all 7 together")


def test_invariant_batch_pads_whole_samples_to_a_padded_row_count():
    from solbench.models.batch_invariance import invariant_batch

    assert invariant_batch(1, 10) == 2  # 20 rows: >= 16 and a multiple of 4
    assert invariant_batch(3, 10) == 4  # 30 rows is not a multiple of 4
    assert invariant_batch(5, 16) == 5 and invariant_batch(1, 3) == 8  # 24 rows
