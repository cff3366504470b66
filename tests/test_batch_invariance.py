"""Row invariance on CPU: a row's result must not depend on the rows computed beside it.

These tests fail on CPUs whose GEMM kernels change with the row count (measured on an Intel
Sapphire Rapids: the modulation layers' M = batch rows differ below M = 11) unless the harness pads.
They assert bit-identity where padding to 16+ rows makes the GEMM row-invariant (Intel MKL on Intel
CPUs); with MKL's AVX2 kernels (AMD CPUs) padding is not enough and they compare up to float32
rounding (tests/_cpu.py).
"""

import torch
from torch import nn

from _cpu import ATOL, RTOL, assert_same_numbers, gemm_rows_invariant
from solbench.batch_invariance import pad_linear_rows
from solbench.models.tiny import load_tiny
from solbench.models.tiny_adapter import TinyAdapter
from solbench.quant import quantized_copy


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
