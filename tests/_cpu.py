"""Whether this CPU's float32 GEMM lets several ranks match one process bit for bit, for the tests
that compare them (and those of solbench.models.batch_invariance's padding).

Every run, rank and worker computes on its config's thread count (numerics.threads, default 1:
solbench.machine.threads), so a thread count never differs between the two sides of a comparison: the tests
compare on 1 thread, as the runs do (issue 39: a quiet machine gave the one-process side 2 threads and
the ranks 1, and on an Intel Xeon with AMX the rewards differed where the probe below, of a few GEMMs,
said they could not). What remains is the batch: two ranks give the numbers of one process bit for bit
only if a sample's forward pass does not depend on how many samples share its batch. solbench pads
every linear layer's input to at least 16 rows and a multiple of 4 (solbench.models.batch_invariance), which is
enough where the GEMM gives a row the same bits for every such row count. Whether it does is the BLAS
kernel's:

- Intel MKL's AVX-512 kernels (Intel Xeons with and without AMX; an AMD EPYC Zen 4): yes. The tests
  assert bit-identity. Without the padding they do not hold (tests/test_kernel_paths.py shows it).
- MKL's AVX2 kernels (``MKL_ENABLE_INSTRUCTIONS=AVX2``, ``ATEN_CPU_CAPABILITY=avx2``): no. A row
  differs in its last bits between a 16-, 24- and 256-row GEMM (only GEMMs of exactly 16 rows agree);
  norms, attention and elementwise ops stay invariant. One velocity of the tiny model computed by 2 ranks
  and by 1 process is then up to 3e-6 apart; the tests compare with RTOL/ATOL (float32 rounding), within
  which x0, log-probs, rewards and velocities stay (0.24 of the bound at most, measured) and which a
  wrong shard exceeds by a factor of 1000 or more.

``gemm_rows_invariant()`` measures which case this CPU is with torch alone (not through solbench's
padding, so a broken padding still fails the exact tests on an invariant CPU), on 1 thread;
tests/test_kernel_paths.py checks its verdict against the tiny engine itself under each kernel cap the
CPU offers, in subprocesses.
"""

from __future__ import annotations

import collections
import contextlib
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
    """Whether F.linear on 1 thread gives every row the bits of its 16-row block computed alone, for
    every row count in ROW_COUNTS, on the tiny model's (K, N) layer shapes."""
    gen = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for k, n in ((64, 128), (128, 384), (128, 512), (512, 128), (640, 128), (256, 128), (128, 768)):
            w, b = torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
            x = torch.randn(max(ROW_COUNTS), k, generator=gen)
            blocks = torch.cat([F.linear(block, w, b) for block in x.split(16)])
            if not all(torch.equal(F.linear(x[:m], w, b), blocks[:m]) for m in ROW_COUNTS):
                return False
        return True
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def one_thread():
    """Compute on 1 thread, as every run and rank does at the default numerics.threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
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
