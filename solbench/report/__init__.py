"""Reports: tables and figures laid out like the Sol-RL paper's, from collected results alone.

``write_report(spec_or_experiment)`` reads ``results/<experiment>/*.parquet`` and writes
``reports/<experiment>/`` (index.md, index.html, one CSV per table, one PNG per figure). Report
kinds are plugins: one function ``(Tables) -> Table | Figure | Note | list`` registered with
``@report_kind``. Built-in kinds, in report order: findings, main_results, timing, cpu_prediction, learning_curves,
reward_hacking, dose_response,
convergence, ranking_fidelity, fidelity_by_iteration, ablations, sweep_heatmap, sweep_cells, cost_projection,
sample_grids.
See docs/reports.md.

Stage ``report`` (solbench/stages.py): it imports its own modules and the stages below it, results, machine, text,
base.
"""

from solbench.report.registry import Figure, Note, ReportKind, Table, get_kind, kinds, report_kind
from solbench.report.tables import ReportOptions, Tables

# Importing the plugin modules registers the built-in report kinds.
from solbench.report import findings as _findings  # noqa: E402,F401  isort: skip
from solbench.report import isolation as _isolation  # noqa: E402,F401  isort: skip
from solbench.report import main_results as _main_results  # noqa: E402,F401  isort: skip
from solbench.report import timing as _timing  # noqa: E402,F401  isort: skip
from solbench.report import cpu_check as _cpu_check  # noqa: E402,F401  isort: skip
from solbench.report import speed_block as _speed_block  # noqa: E402,F401  isort: skip
from solbench.report import run_timing as _run_timing  # noqa: E402,F401  isort: skip
from solbench.report import hacking as _hacking  # noqa: E402,F401  isort: skip
from solbench.report import dose as _dose  # noqa: E402,F401  isort: skip
from solbench.report import curves as _curves  # noqa: E402,F401  isort: skip
from solbench.report import fidelity as _fidelity  # noqa: E402,F401  isort: skip
from solbench.report import fidelity_steps as _fidelity_steps  # noqa: E402,F401  isort: skip
from solbench.report import ablations as _ablations  # noqa: E402,F401  isort: skip
from solbench.report import sweep_cells as _sweep_cells  # noqa: E402,F401  isort: skip
from solbench.report import cost as _cost  # noqa: E402,F401  isort: skip
from solbench.report import samples as _samples  # noqa: E402,F401  isort: skip
from solbench.report import provenance as _provenance  # noqa: E402,F401  isort: skip
from solbench.report.build import write_report  # noqa: E402  isort: skip

__all__ = ["Figure", "Note", "ReportKind", "ReportOptions", "Table", "Tables", "get_kind", "kinds",
           "report_kind", "write_report"]
