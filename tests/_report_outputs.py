"""Reading a report kind's outputs off a synthetic results folder (fixtures/arm_results.py), for the report tests
named by the behaviour they hold (tests/test_report_claims_compare_the_right_arms.py and its neighbours): one
output by name, one finding row, a linear score curve, and the synthetic folders more than one of them builds
(all-seeds fidelity runs of final checkpoints, and two arms timed with some seeds under contention).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fixtures.arm_results import METRIC, Arm, build_arms, fidelity_run
from solbench.report import get_kind


def outputs(tables, kind):
    return get_kind(kind)(tables)


def named(tables, kind, name):
    found = [o for o in outputs(tables, kind) if getattr(o, "name", None) == name]
    assert found, [getattr(o, "name", o) for o in outputs(tables, kind)]
    return found[0]


def finding(tables, claim, metric=METRIC):
    data = named(tables, "findings", "findings").data
    rows = data[(data["claim"] == claim) & (data["metric"] == metric)]
    assert len(rows) == 1, sorted(set(data["claim"]))
    return rows.iloc[0]


def linear(rate):
    return lambda step, seed: rate * step


def fidelity(rid, recipe, *, checkpoint=None, rng, rewards=(METRIC, "shapes_clip"), shift=None, binary=(), noise=0.05):
    """A fidelity run whose explore images score ``shift[reward]`` below full precision (0 by default), and whose
    rewards in ``binary`` are pass/fail at both precisions."""
    row, cand = fidelity_run("f48", rid, recipe, checkpoint=checkpoint, rho_noise=lambda i: noise, rng=rng,
                             rewards=rewards)
    for c in cand:
        if c["precision"] == "explore":
            c["reward"] -= (shift or {}).get(c["reward_name"], 0.0)
        if c["reward_name"] in binary:  # pass/fail; the explore copy flips every fourth candidate's outcome
            c["reward"] = float((c["reward"] > 0.5) != (c["precision"] == "explore" and c["cand_idx"] % 4 == 0))
    return row, cand


def fidelity_arm_tables(options, tmp_path, name, runs_spec, *, seeds=(0, 1, 2), rewards=(METRIC, "shapes_clip"),
                        **kw):
    """A 12-iteration Sol-RL arm of ``seeds`` and the fidelity runs ``runs_spec`` ((run id, recipe, checkpoint)
    each): the loaded tables and the candidates."""
    rng = np.random.default_rng(5)
    runs, cand = [], []
    for rid, recipe, checkpoint in runs_spec:
        row, rows = fidelity(rid, recipe, checkpoint=checkpoint, rng=rng, rewards=rewards, **kw)
        runs.append(row)
        cand += rows
    return build_arms(tmp_path, name, [Arm("sol_rl", gain=linear(0.01), steps=(0, 6, 12), iterations=12, seeds=seeds,
                                           extra={"p_quant.recipe": "nvfp4_tiny_flux"})],
                      extra_runs=runs, candidates=cand, options=options), pd.DataFrame(cand)


def finals(seeds, recipe="nvfp4_tiny_flux"):
    return [(f"fid-final-{s}", recipe, dict(method="sol_rl", step=12, run_id=f"sol_rl-it12-s{s}")) for s in seeds]


def contended_speed_tables(options, tmp_path, name, contended_seeds):
    """naive BF16 scaling 2 s per iteration, 6 s where its cores were shared (load 0.9); Sol-RL 1 s."""
    busy = set(contended_seeds)
    return build_arms(tmp_path, name, [
        Arm("naive_scaling", gain=linear(0.0), seeds=(0, 1, 2), steps=(0, 4),
            phases=[("rollout", "full", 1e9, lambda s: 6.0 if s in busy else 2.0)],
            load=lambda s: 0.9 if s in busy else 0.02),
        Arm("sol_rl", gain=linear(0.0), seeds=(0, 1, 2), steps=(0, 4),
            phases=[("explore", "explore", 1e9, 0.5), ("regenerate", "full", 1e9, 0.5)], load=lambda s: 0.02)],
        options=options)
