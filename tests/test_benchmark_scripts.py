"""The benchmark scripts run and print their tables (smallest settings; numbers are not asserted:
speed goals live in the benchmarks' own output, never in tests)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_rollout_benchmark_prints_one_row_per_precision_and_batch():
    out = subprocess.run(
        [sys.executable, "benchmarks/rollout.py", "--steps", "1", "--repeats", "1", "--batches", "1,4",
         "--precisions", "fp32,nvfp4", "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True).stdout
    header = next(line for line in out.splitlines() if "precision" in line and "engine overhead" in line)
    assert "row padding" in header
    progress = [line.split() for line in out.splitlines() if line.split()[:1] in (["fp32"], ["nvfp4"])]
    assert [(row[0], row[1]) for row in progress] == [("fp32", "1"), ("fp32", "4"), ("nvfp4", "1"), ("nvfp4", "4")]
    for row in progress:
        images_per_s, overhead = float(row[2]), float(row[-1].rstrip("%"))
        assert images_per_s > 0 and 0 <= overhead < 100
