"""Whether this CPU's float32 GEMM lets several ranks match one process bit for bit, for the tests
that compare them (and those of solbench.batch_invariance's padding).

Two ranks give the numbers of one process bit for bit only if a sample's forward pass does not
depend on how many samples share its batch (a rank holds part of it) nor on the thread count (the
ranks run 1 thread each, the test process 2). solbench pads every linear layer's input to at least
16 rows and a multiple of 4 (solbench.batch_invariance), which is enough where the GEMM gives a row
the same bits for every such row count and thread count. Whether it does is the BLAS kernel's:

- Intel MKL on Intel CPUs (AVX-512 kernels; this project's machines, Sapphire Rapids): yes. The
  tests assert bit-identity.
- AMD EPYC Zen 4 (avx512, avx512_bf16; 2026-11-26): yes at the padded row counts. Below them it is
  not: at 5 or 10 rows (K = 64, 128) a row has other bits with 1 thread than with 2. That is how the
  tiny text encoder, whose fused layer runs its projections out of reach of the padding hooks (10
  rows per prompt), made 1-thread ranks disagree with a 2-thread process until it padded its batch
  (solbench.models.tiny); a convolution over one image also differs from one over several, so the
  engine pads reward calls like network calls. The tests then hold bit for bit there.
- MKL's AVX2 kernels (forced on an Intel CPU with ``MKL_ENABLE_INSTRUCTIONS=AVX2``): no. A row differs in its last bits between a 16-, 24- and 256-row GEMM and
  between 1 and 2 threads (only GEMMs of exactly 16 rows agree); norms, attention and elementwise
  ops stay invariant. One velocity of the tiny model computed by 2 ranks and by 1 process is then
  up to 3e-6 apart; the tests compare with RTOL/ATOL (float32 rounding), within which x0,
  log-probs, rewards and velocities of their 2-rank runs stay with these kernels.

``gemm_rows_invariant()`` measures which case this CPU is with torch alone (not through solbench's
padding, so a broken padding still fails the exact tests on an invariant CPU).
"""

from __future__ import annotations

import collections
import functools

import torch
import torch.nn.functional as F

RTOL = 1e-5  # float32 keeps ~7 digits; a K-sum of a few hundred terms reordered moves the 6th-7th
ATOL = 1e-6
ROW_COUNTS = (16, 20, 24, 64, 256, 296, 512, 592)  # padded row counts of the tiny model's layers
#: How many comparisons ran bit for bit and how many up to float32 rounding (printed at the end of
#: the session by conftest.pytest_terminal_summary, so a CI log says which mode the tests ran in).
COMPARISONS: collections.Counter = collections.Counter()


@functools.cache
def gemm_rows_invariant() -> bool:
    """Whether F.linear gives every row the bits of its 16-row block computed alone, for every row
    count in ROW_COUNTS and 1 or 2 threads, on the tiny model's (K, N) layer shapes."""
    gen = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    try:
        for k, n in ((64, 128), (128, 384), (128, 512), (512, 128), (640, 128), (256, 128), (128, 768)):
            w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
            x = torch.randn(max(ROW_COUNTS), k, generator=gen)
            torch.set_num_threads(1)
            blocks = torch.cat([F.linear(block, w, b) for block in x.split(16)])
            for count in (1, 2):
                torch.set_num_threads(count)
                if not all(torch.equal(F.linear(x[:m], w, b), blocks[:m]) for m in ROW_COUNTS):
                    return False
        return True
    finally:
        torch.set_num_threads(threads)


def assert_same_numbers(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Bit-identical where the GEMM is row-invariant (see the module docstring), else equal up to
    float32 rounding."""
    if gemm_rows_invariant():
        COMPARISONS["bit for bit"] += 1
        assert torch.equal(actual, expected), f"{what}: not bit-identical (this CPU's GEMM is row-invariant)"
    else:
        COMPARISONS["up to float32 rounding"] += 1
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL, msg=lambda m: (
            f"{what}: beyond float32 rounding (this CPU's GEMM depends on the row count, so the test "
            f"compares with a tolerance; tests/_cpu.py): {m}"))
