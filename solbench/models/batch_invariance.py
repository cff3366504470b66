"""Row-invariant linear layers on CPU: a candidate's result must not depend on its batch.

Sol-RL regenerates the seeds it explored, the trainer recomputes a rollout's log-probs in other
micro-batches, and several ranks compute shards of one rollout; on CPU the harness makes all of
these bit-identical to computing the candidate alone. CPU GEMM libraries are row-invariant only for
some row counts (measured with torch 2.13's MKL sgemm):

- AMD EPYC (AVX2/AVX-512 kernels): rows agree across M only when M is a multiple of 4 (M = 1..3 and
  the tail rows of M = 10 differ in the last bit). On a Zen 4 EPYC (2026-11-26) M = 5 and 10 also
  gave other bits with 1 thread than with 2 (K = 64, 128); from 16 rows, multiples of 4, every row
  and thread count tried agreed.
- Intel Xeon (Sapphire Rapids): small M takes another kernel; with 2 threads rows agree with large
  M only from M = 3 to 11 on, depending on K (K = 256: M >= 11); with 1 thread from M = 16 on for
  every shape tried (K up to 4096).

Inside a transformer most GEMMs have M = batch x tokens (large), but the timestep / modulation
layers see M = batch rows. ``pad_linear_rows`` pads the rows of every ``nn.Linear`` (and
solbench.quant's QuantLinear) input to at least ``min_rows`` and to a multiple of ``multiple`` with
zero rows, dropped from the output: every GEMM then runs on a row count that is invariant on both
kinds of CPU. The padded layers are the cheap ones (M = batch), so the cost is small; the engine
also pads whole batches to a multiple of 4 (solbench.engine.engine.Engine) for the other ops, reward calls
included (a convolution over one image takes another kernel than over several). Modules that call
their projections as functions, which the hooks cannot see (nn.TransformerEncoderLayer's fused
inference path in the tiny text encoder), pad whole samples instead (``invariant_batch``).

This is a CPU measure for the small models that run here. Large GEMMs with 2+ threads may split K
by problem size, and GPUs give no such guarantee either: there a regenerated candidate has the same
noise and the same computation, equal up to floating-point reordering.

The large GEMMs (M = batch x tokens) are not padded, and their invariance is the BLAS kernel's.
Intel MKL's AVX-512 kernels, which it runs on Intel CPUs, give a row the same bits for every row
and thread count tried. MKL's AVX2 kernels, which it runs on AMD CPUs (``MKL_ENABLE_INSTRUCTIONS=AVX2``
reproduces them on an Intel CPU), do not: rows agree only within GEMMs of at most 16 rows, so the
same sample computed by a rank holding 4 samples (256 rows) and by one process holding 8 (512 rows)
differs in the last bits (x0 in the 7th digit); norms, attention and elementwise ops are invariant
there. Making those GEMMs invariant too (batched 16-row blocks) cost the large layers 1.3-3x on CPU here,
so there the guarantee is scoped: ranks agree with one process up to float32 rounding. The tests
probe which case a machine is (tests/_cpu.py) and assert bit-identity or that tolerance.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

from solbench.quant.layers import QUANTIZED_LAYER_TYPES

CPU_MIN_ROWS = 16
CPU_ROW_MULTIPLE = 4
ROW_PADDED_TYPES = (nn.Linear, *QUANTIZED_LAYER_TYPES)  # row-wise layers: padding rows cannot change the others


def invariant_batch(batch: int, rows_per_sample: int, min_rows: int = CPU_MIN_ROWS,
                    multiple: int = CPU_ROW_MULTIPLE) -> int:
    """The smallest batch >= ``batch`` whose ``batch * rows_per_sample`` GEMM rows are a row count
    ``pad_linear_rows`` would run at (>= ``min_rows``, a multiple of ``multiple``).

    For modules that call their projections as functions, out of reach of ``pad_linear_rows``'
    module hooks (nn.TransformerEncoderLayer's fused inference path: in_proj, out_proj and its
    feed-forward run inside one native op): they pad whole samples instead of rows.
    """
    if batch < 1 or rows_per_sample < 1:
        raise ValueError(f"invariant_batch: batch ({batch}) and rows_per_sample ({rows_per_sample}) must be >= 1")
    padded = batch
    while padded * rows_per_sample < min_rows or (padded * rows_per_sample) % multiple:
        padded += 1
    return padded


@contextmanager
def pad_linear_rows(min_rows: int = CPU_MIN_ROWS, multiple: int = CPU_ROW_MULTIPLE):
    """Within the block, every linear layer computes on >= min_rows rows, a multiple of ``multiple``.

    Implemented with global module hooks, registered for the duration of the block (process-wide:
    the engine runs its network calls on one thread): a pre-hook pads the flattened input rows with
    zeros, the forward hook drops them and restores the input's leading shape. Gradients flow
    through both.
    """
    if min_rows < 1 or multiple < 1:
        raise ValueError(f"pad_linear_rows: min_rows ({min_rows}) and multiple ({multiple}) must be >= 1")
    pending: list[torch.Size | None] = []  # per open linear call: its input shape if padded

    def pad(module, args):
        if not isinstance(module, ROW_PADDED_TYPES):
            return None
        x = args[0]
        k = x.shape[-1]
        rows = x.numel() // k if k else 0
        target = max(min_rows, -(-rows // multiple) * multiple)
        if rows == 0 or target == rows:
            pending.append(None)
            return None
        pending.append(x.shape)
        x2d = x.reshape(rows, k)
        return (torch.cat([x2d, x2d.new_zeros(target - rows, k)]), *args[1:])

    def unpad(module, args, output):
        if not isinstance(module, ROW_PADDED_TYPES):
            return None
        shape = pending.pop()
        if shape is None:
            return None
        rows = shape.numel() // shape[-1]
        return output[:rows].reshape(*shape[:-1], output.shape[-1])

    handles = [register_module_forward_pre_hook(pad), register_module_forward_hook(unpad)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
