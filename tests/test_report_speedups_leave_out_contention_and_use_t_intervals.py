"""Measured speedups (Table 5 and its finding): runs timed under contention are left out and named, the explore
format and backend stand beside the number, and the interval over 2-3 seeds is a t interval of the log ratio, not a
percentile bootstrap (issues 41, 42, 48). Expected numbers are closed forms of fixtures/arm_results.py folders.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from _report_outputs import contended_speed_tables, finding, named
from fixtures.arm_results import Arm, build_arms
from solbench.report import ReportOptions

OPTS = ReportOptions(n_boot=400)


def test_speed_findings_leave_out_runs_timed_under_contention(tmp_path):
    """Catches the committed report's 2.55x rollout speedup, taken against naive BF16 scaling timed beside test
    suites (10.71 s per iteration against 4.52 s quiet): a contended run is left out and named."""
    tables = contended_speed_tables(OPTS, tmp_path, "busy", [2])
    row = finding(tables, "Sol-RL rollout speedup over naive BF16 scaling (measured)", metric="")
    assert row["effect"] == pytest.approx(2.0)  # quiet runs only: 2 / 1 (with the contended one: 3.33)
    assert "Left out as timed under contention" in row["detail"] and "load 0.90" in row["detail"]
    table5 = named(tables, "timing", "timing_table5")
    assert table5.data["rollout_speedup"].iloc[0] == pytest.approx(2.0)
    assert "Left out as timed under contention" in table5.caption
    # the explore format and backend beside the speed number (issue 41, item 5)
    assert "Sol-RL's explore copy: NVFP4 (nvfp4_tiny)" in row["detail"] and "emulated backend" in row["detail"]
    assert table5.display["target's explore (format, recipe, backend)"].str.contains("NVFP4 \\(nvfp4_tiny\\)").all()
    every = contended_speed_tables(OPTS, tmp_path, "all_busy", [0, 1, 2])
    row = finding(every, "Sol-RL rollout speedup over naive BF16 scaling (measured)", metric="")
    assert math.isnan(row["effect"]) and "None of naive BF16 scaling is left" in row["detail"]


def test_speed_intervals_are_t_intervals_over_seeds_not_a_percentile_bootstrap():
    """Catches the percentile bootstrap of speedups over 2-3 seeds that docs/reports.md itself says undercovers:
    by simulation at 3 seeds per arm the log-ratio t interval covers the true ratio at least 90 % of the time, the
    bootstrap's clearly less; with one seed in an arm there is no interval."""
    from solbench.report.stats import bootstrap_ci, ratio_ci

    rng = np.random.default_rng(1)
    ratio = lambda a, b: float(np.mean(a) / np.mean(b))  # noqa: E731
    t_cover = boot_cover = 0
    n = 300
    for i in range(n):
        base, target = rng.normal(4.0, 0.4, 3), rng.normal(2.0, 0.2, 3)
        lo, hi = ratio_ci(base, target)
        t_cover += lo <= 2.0 <= hi
        blo, bhi = bootstrap_ci([base, target], ratio, n_boot=300, seed=i)
        boot_cover += blo <= 2.0 <= bhi
    assert t_cover / n >= 0.9 and boot_cover / n < 0.85
    assert all(math.isnan(v) for v in ratio_ci([1.0], [1.0, 2.0]))


def test_the_speed_finding_and_table5_say_t_interval(tmp_path):
    """Catches the Findings' speed row covering "run seeds of each arm (3 and 3), bootstrap"."""
    tables = build_arms(tmp_path, "speed", [
        Arm("naive_scaling", seeds=(0, 1, 2), steps=(0, 4), phases=[("rollout", "full", 1e9, lambda s: 2.0 + 0.1 * s)]),
        Arm("sol_rl", seeds=(0, 1, 2), steps=(0, 4), phases=[("explore", "explore", 1e9, lambda s: 0.5 + 0.05 * s)])],
        options=OPTS)
    data = named(tables, "findings", "findings").data
    row = data[data["claim"] == "Sol-RL rollout speedup over naive BF16 scaling (measured)"].iloc[0]
    assert "t interval of the log ratio" in row["covers"] and "bootstrap" not in row["covers"]
    assert "t interval of the log ratio" in named(tables, "timing", "timing_table5").caption
