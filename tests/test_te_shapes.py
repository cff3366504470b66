"""TE's shape rule on CPU: quantized GEMMs need the product of the input's leading dimensions to be a
multiple of 8 (FP8) or 16 (NVFP4). TELinear pads rows with zeros (solbench.quant.layers.te_rows_padded);
a stand-in that raises like TE and quantizes like the emulated NVFP4 layer shows that any batch works
and that the padding changes no real row.

Bug caught: FLUX's modulation layers get [B, 3072] inputs, so every chunk, CFG half or rank shard with
B not a multiple of 16 raised inside TE on the GPU.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solbench import quant
from solbench.models.batch_invariance import pad_linear_rows
from solbench.quant.layers import QuantLinear, te_row_multiple, te_rows_padded


class TEShapeStandIn(nn.Module):
    """te.Linear's contract where it matters here: rows must be a multiple of ``multiple``."""

    def __init__(self, inner: nn.Module, multiple: int) -> None:
        super().__init__()
        self.inner, self.multiple = inner, multiple
        self.seen_rows: list[int] = []

    def forward(self, x):
        rows = x.numel() // x.shape[-1]
        self.seen_rows.append(rows)
        if rows % self.multiple:
            raise RuntimeError(f"input rows {rows} not divisible by {self.multiple} (TE's GEMM shape rule)")
        return self.inner(x)


@pytest.fixture(scope="module")
def nvfp4_layer():
    torch.manual_seed(0)
    linear = nn.Linear(64, 48)
    recipe = quant.get_recipe("nvfp4_tiny")
    return QuantLinear.from_linear(linear, recipe, name="norm1.linear", shared_inputs=None), recipe


def test_row_multiples_follow_the_format(nvfp4_layer):
    _, recipe = nvfp4_layer
    assert te_row_multiple(recipe) == 16
    assert te_row_multiple(quant.get_recipe("fp8_w8a8")) == 8


@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (7, 64), (16, 64), (17, 64), (30, 64), (2, 5, 64), (3, 3, 64)])
def test_padding_makes_every_batch_run_and_changes_no_row(nvfp4_layer, shape):
    layer, recipe = nvfp4_layer
    stand_in = TEShapeStandIn(layer, te_row_multiple(recipe))
    x = torch.randn(*shape)
    rows = x.numel() // 64
    if rows % 16:
        with pytest.raises(RuntimeError, match="TE's GEMM shape rule"):
            stand_in(x)
    with pad_linear_rows():  # row-invariant CPU GEMMs: padded and unpadded rows compare bit for bit
        out = te_rows_padded(stand_in, x, te_row_multiple(recipe))
        reference = layer(x.reshape(rows, 64)).reshape(*shape[:-1], 48)
    assert stand_in.seen_rows[-1] % 16 == 0 and out.shape == (*shape[:-1], 48)
    torch.testing.assert_close(out, reference, rtol=0, atol=0)  # zero rows move neither amax nor any block scale
