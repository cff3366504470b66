"""The benchmark scripts run and print their tables (smallest settings; numbers are not asserted:
speed goals live in the benchmarks' own output, never in tests)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_rollout_benchmark_prints_one_row_per_precision_and_batch():
    out = subprocess.run(
        [sys.executable, "benchmarks/rollout.py", "--steps", "1", "--repeats", "1", "--batches", "1,4",
         "--precisions", "fp32,nvfp4", "--threads", "1", "--load", "both"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "CPU: " in out  # the CPU model goes with every table
    progress = [line.split() for line in out.splitlines() if line.split()[:1] in (["fp32"], ["nvfp4"])]
    assert [(row[0], row[1]) for row in progress] == [("fp32", "1"), ("fp32", "4"), ("nvfp4", "1"), ("nvfp4", "4")]
    for row in progress:
        # precision, batch, images/s quiet (best/median), % GEMM, images/s loaded, % GEMM, GEMM GFLOP/s,
        # bare fwd, engine fwd, row padding, overhead
        assert len(row) == 11
        quiet, loaded = (float(cell.split("/")[0]) for cell in (row[2], row[4]))
        overhead = float(row[-1].rstrip("%"))
        assert quiet > 0 and loaded > 0 and 0 <= overhead < 100
        assert float(row[6]) > 0  # the GEMM rate measured with the repeats, not assumed


def test_busy_load_stops_its_processes():
    """Catches: the "loaded" column's busy-loop processes outliving the benchmark (a stray spinner
    would slow everything after it, every later "quiet" column included)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from _load import busy_load
    finally:
        sys.path.pop(0)

    with busy_load(2) as workers:
        assert len(workers) == 2 and all(w.poll() is None for w in workers)  # running
    assert all(w.poll() is not None for w in workers)  # stopped and reaped


def test_lora_rollout_benchmark_compares_the_view_with_a_merged_copy_of_the_same_role():
    """Catches: the merged copy computing other images than the LoRA role it stands for (a wrong
    or missing merge shows as a large max |dx0|), or the script not running at all."""
    out = subprocess.run(
        [sys.executable, "benchmarks/lora_rollout.py", "--steps", "2", "--repeats", "1", "--batches", "4",
         "--load", "quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "CPU: " in out
    rows = [line.replace("│", " ").split() for line in out.splitlines() if line.replace("│", " ").split()[:1] == ["4"]]
    assert len(rows) == 1
    cells = rows[0]  # batch, view min / median, merged min / median, speedup, max |dx0|
    assert float(cells[1]) > 0 and float(cells[4]) > 0 and cells[7].endswith("x")
    assert float(cells[-1]) < 1e-3


def test_explore_cpu_benchmark_prints_every_backend_beside_full_precision():
    """Catches: the issue-45 benchmark not running, or dropping an arm (the cpu_bf16 row is the one that says
    whether this CPU's explore beats full precision; its profile splits GEMM time from the quantizer's)."""
    out = subprocess.run(
        [sys.executable, "benchmarks/explore_cpu.py", "--batch", "4", "--repeats", "1", "--profile"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    assert "CPU: " in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split()[:1] in (["fp32"], ["emulated"], ["cpu_bf16"]) and " ms " in line}
    assert set(rows) == {"fp32", "emulated", "cpu_bf16"}
    for name, row in rows.items():  # name, min, /, median, ms, ratio
        assert float(row[1]) > 0 and float(row[3]) > 0 and row[5].endswith("x")
    assert "goal" in " ".join(rows["cpu_bf16"])
    breakdown = [line for line in out.splitlines() if line.startswith(("GEMM  ", "input quantizer"))]
    assert len(breakdown) == 2 and float(breakdown[1].split()[-1]) > 0  # cpu_bf16 quantizes its inputs
