"""Per-run timings, published: each training run's median seconds per phase and its load (run_timing.csv).

Table 5 pools runs into arms; a reader needs each run to see an outlier (a run timed beside other work, a run
faster than its arm). One row per done run: its arm, method and seed, the median over its iterations (after the
warm-up, solbench.report.timing.iteration_seconds) of rollout and E2E seconds and of each phase, and its load
(solbench.report.timing.run_load: the 90th percentile over its iterations, the mean and the busiest).
"""

from __future__ import annotations

import pandas as pd

from solbench.report.registry import Table, report_kind
from solbench.report.stats import fmt_num
from solbench.report.tables import Tables


def run_timing_frame(tables: Tables) -> pd.DataFrame:
    from solbench.report.timing import _phase_order, per_run_medians, run_load

    med, phase_med, _ = per_run_medians(tables)
    if med.empty:
        return pd.DataFrame()
    wide = phase_med.pivot_table(index="run_id", columns="phase", values="seconds", aggfunc="first")
    wide = wide[_phase_order(wide.columns)].add_prefix("phase_").add_suffix("_s").reset_index()
    out = med.merge(wide, on="run_id", how="left")
    loads = run_load(tables)
    if not loads.empty:
        out = out.merge(loads.rename(columns={"load": "load_p90"}), on="run_id", how="left")
    order = {arm: i for i, arm in enumerate(tables.arm_order(tables.done_runs))}
    out = out.assign(_order=out["arm"].map(order)).sort_values(["model", "_order", "seed", "run_id"]).drop(columns="_order")
    first = ["run_id", "model", "arm", "method", "seed", "rollout_s", "e2e_s"]
    return out[first + [c for c in out.columns if c not in first]].reset_index(drop=True)


@report_kind("run_timing", title="Per-run timings", order=22)
def run_timing(tables: Tables):
    """Every run's median seconds per iteration and phase, and its load: the runs Table 5 pools."""
    from solbench.report.timing import CONTENTION

    data = run_timing_frame(tables)
    if data.empty:
        return []
    display = data[["run_id", "arm", "seed"]].astype(str).copy()
    display["rollout (s)"] = data["rollout_s"].map(lambda v: fmt_num(v, 3))
    display["E2E (s)"] = data["e2e_s"].map(lambda v: fmt_num(v, 3))
    for col in [c for c in data.columns if c.startswith("phase_")]:
        display[col[len("phase_"):-len("_s")]] = data[col].map(lambda v: fmt_num(v, 3))
    if "load_p90" in data:
        display["load (p90 / max)"] = [f"{p:.2f} / {m:.2f}" + (" **contended**" if p > CONTENTION else "")
                                       if pd.notna(p) else "-" for p, m in zip(data["load_p90"], data["load_max"])]
    return [Table("run_timing", "Per-run timings: median seconds per iteration and phase, and load", data, (
        "One row per done run (the runs Table 5's arms pool): the median over its iterations after the warm-up of "
        "rollout and E2E seconds and of each phase; load: how many of the run's cores other programs kept busy, the "
        f"90th percentile over its iterations (the check Table 5 applies: above {CONTENTION} the run is left out as "
        "contended) and its busiest iteration. run_timing.csv has every column."), display=display)]
