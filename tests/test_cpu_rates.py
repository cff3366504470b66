"""A CPU run with an explore copy records this CPU's rates at its shapes (cpu_rates.json, solbench.train.cpu_rates),
the collected runs table carries them, and measuring them changes none of the run's numbers."""

from __future__ import annotations

import json

from _tiny_config import small_config
from solbench.train import cpu_rates
from solbench.results import RunStore
from solbench.train.trainer import Trainer


def _run(tmp_path, name, monkeypatch, measure: bool):
    cfg = small_config("naive_fp4", experiment=name, planned_iterations=2, seed=5)
    cfg.quant.backend = "cpu_bf16"
    if not measure:
        monkeypatch.setattr(Trainer, "_record_cpu_rates", lambda self: None)
    monkeypatch.setattr(cpu_rates, "_CACHE", {})
    folder = tmp_path / name / cfg.run_id
    Trainer(cfg, RunStore(folder, cfg.run_id)).run()
    monkeypatch.undo()
    return folder


def test_rates_are_recorded_and_change_no_number(tmp_path, monkeypatch):
    """Catches a measurement that draws from the run's random streams (the metrics would move: its inputs must come
    from a private generator), rates that are not rates (zero, NaN, the same number for both precisions), and a
    runs table without them (the report's CPU prediction would silently vanish)."""
    from solbench.collect.collection import _rate_columns

    measured = _run(tmp_path, "with", monkeypatch, measure=True)
    plain = _run(tmp_path, "without", monkeypatch, measure=False)
    rates = json.loads((measured / "cpu_rates.json").read_text())
    assert not (plain / "cpu_rates.json").exists()
    gemm, forward = rates["gemm"], rates["forward"]
    assert gemm["fp32_gflops"] > 0 and gemm["bf16_gflops"] > 0 and gemm["fp32_gflops"] != gemm["bf16_gflops"]
    assert forward["full_gflops"] > 0 and forward["explore_gflops"] > 0 and forward["full_role"] == "old"  # naive FP4 samples with the old policy
    assert gemm["shapes"] and all(count >= 1 for _, _, count in gemm["shapes"])

    def values(folder):
        store = RunStore(folder, folder.name)
        return [(r["step"], r["split"], r["metric"], r["value"]) for r in store.read("metrics")
                if not r["metric"].startswith(("time", "wall"))]

    assert values(measured) == values(plain)
    row = _rate_columns(rates)  # what collect puts in the runs table
    assert row["rate_gemm_fp32"] == gemm["fp32_gflops"] and row["rate_gemm_bf16"] == gemm["bf16_gflops"]
    assert row["rate_forward_full"] == forward["full_gflops"] and row["rate_forward_explore"] == forward["explore_gflops"]
    assert json.loads((measured / "explore.json").read_text())["backend"] == "cpu_bf16"
