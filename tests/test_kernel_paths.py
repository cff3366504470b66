"""The same-numbers guarantee under each CPU kernel path this CPU offers, tested on the engine itself
instead of trusted to tests/_cpu.py's probe of a few GEMMs (issue 39).

The machines solbench meets differ in the kernels torch, MKL and oneDNN pick: AVX-512 (Intel Xeons with
and without AMX, AMD EPYC Zen 4) or AVX2. Each path runs in a subprocess with the caps set before torch
loads (tests/_kernel_path_check.py): the tiny engine's rollout of 5 candidates computed whole and as the
shards of 2 ranks, on 1 thread. On every path:

- the shards stay within the float32 bound the tests use where they cannot be exact (tests/_cpu.py RTOL,
  ATOL), and a wrong shard (rank 1 off by one candidate) exceeds it by orders of magnitude;
- where the probe says the path is row-invariant, the shards give the whole batch's bits, and with the
  engine's padding off they do not: the exact comparison catches a broken padding there. Where the probe
  says it is not (AVX2), the shards differ in their last bits, inside the bound, padding or not: on those
  paths a broken padding is below what any comparison of float32 results can tell from the kernels' own
  reordering, and the closing line of the suite says which mode the comparisons ran in.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from solbench.machine.cpu import cpu_flags

TESTS = Path(__file__).resolve().parent
_CAP_VARS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_CBWR")


def kernel_paths() -> dict[str, dict[str, str]]:
    """The kernel caps this CPU can run: its own kernels, and each lower x86 level it supports."""
    paths = {"native": {}}
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        paths["avx512"] = {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512",
                           "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}
    if {"avx2", "fma"} <= flags:
        paths["avx2"] = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return paths


PATHS = kernel_paths()


def check(path: str, mutation: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _CAP_VARS}
    env.update(PATHS[path])
    proc = subprocess.run([sys.executable, str(TESTS / "_kernel_path_check.py"), mutation], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("path", sorted(PATHS))
def test_shards_match_the_whole_batch_as_the_probe_says_and_a_broken_padding_or_shard_is_caught(path):
    same = check(path, "none")
    tensors = same["tensors"]
    assert all(t["bound_ratio"] <= 1.0 for t in tensors.values()), (path, same)
    if same["probe_invariant"]:
        # Bug caught: a probe that calls a path invariant where the engine is not (the issue-39 failure:
        # "invariant" said, rewards not bit-identical)
        assert all(t["identical"] for t in tensors.values()), (path, same)
        broken = check(path, "no_padding")["tensors"]
        assert not broken["x0"]["identical"], (path, broken)  # the exact comparison sees a broken padding
    wrong = check(path, "wrong_shard")["tensors"]
    assert all(wrong[name]["bound_ratio"] > 100 for name in ("x0", "log_probs", "rewards")), (path, wrong)
    if path == "avx2":
        assert same["capability"] == "AVX2"  # the cap took effect: the test ran the kernels it names


def test_this_machine_offers_more_than_one_kernel_path_on_x86():
    # Bug caught: a flag reading that finds no path but the native one, so the caps above never run.
    import platform

    if platform.machine() in ("x86_64", "AMD64"):
        assert "avx2" in PATHS, cpu_flags()
    assert "native" in PATHS
