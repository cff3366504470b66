"""What every quantized-layer backend shares (emulated, TransformerEngine, torch's scaled matmul): the
error for a backend that cannot run here, and the zero-row padding of a GEMM input to the row
multiple the low-precision kernels tile by. A leaf of solbench.quant: layers.py and native.py both
import it, and it imports neither.
"""

from __future__ import annotations

from typing import Callable

import torch


class BackendUnavailableError(RuntimeError):
    """The requested quantization backend cannot run in this environment."""


def te_rows_padded(linear: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, multiple: int) -> torch.Tensor:
    """``linear(x)`` with x's rows zero-padded to a multiple of ``multiple`` and the padding dropped after.

    TE raises on a GEMM whose leading dimensions do not multiply to a multiple of 8 (16 for FP4):
    FLUX's modulation layers see [B, 3072] inputs, so any rollout chunk, CFG half or rank shard whose
    B is not a multiple failed. Zero rows change no real row's result: quantization scales are per
    16-element block along a row and the per-tensor amax ignores zeros.
    """
    lead, width = x.shape[:-1], x.shape[-1]
    rows = x.numel() // width if width else 0
    pad = (-rows) % multiple
    if pad == 0:
        return linear(x)
    flat = torch.cat([x.reshape(rows, width), x.new_zeros(pad, width)])
    out = linear(flat)
    return out[:rows].reshape(*lead, out.shape[-1])
