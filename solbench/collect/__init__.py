"""``collect``: one experiment's run folders merged into the parquet tables a report reads, with the facts the report
needs from code (``solbench collect``, and ``solbench run`` after its runs).

``collect`` merges an experiment's runs into ``runs.parquet`` (one row per run, every resolved config field
flattened as a ``p_``-prefixed column, the run's facts beside them), ``metrics.parquet``, ``timings.parquet`` and
``candidates.parquet``, the speed block's ``speed.parquet`` where one ran, the paper models' facts and the
experiment's provenance deviations, plus ``collect_report.json`` naming every corrupt line it skipped and every
damaged run.

This package only re-exports its modules' names, one job each: ``collection`` (``collect`` to parquet) and
``facts`` (the facts collect adds: a run's own facts.json or those computed from its spec.json, the paper models'
committed facts, the provenance table's deviations). Its modules import one another directly, never this package.

Stage ``collect`` (solbench/stages.py): it imports its own modules and the stages below it, spec, train, method,
engine, rewards, models, quant, world, report, results, machine, text, base.
"""

from solbench.collect.collection import CollectResult, collect, flatten, iter_run_dirs

__all__ = ["CollectResult", "collect", "flatten", "iter_run_dirs"]
