"""Provenance: where a real spec differs from the reference code, from its provenance table.

A real spec (flux_main, sd35_main, sana_main) has experiments/provenance/<name>.yaml: every setting a
reference fixes, with its source, and the deviations with their reasons (solbench.provenance; the
test suite checks the table against the spec). This section lists the deviations, so a reader of the
results sees what the runs did differently from each method's reference; experiments without a table
(the embedded world) get a note saying none is claimed. The table is read when the results are collected
(solbench.collect.facts.provenance_record: provenance.parquet and collect_report.json's ``provenance``),
not by the report.
"""

from __future__ import annotations

import json

import pandas as pd

from solbench.report.registry import Note, Table, report_kind
from solbench.report.stored import missing
from solbench.report.tables import Tables
from solbench.results.stored_facts import PROVENANCE_TABLE


@report_kind("provenance", title="Provenance: deviations from the reference code", order=90)
def provenance_section(tables: Tables):
    """Settings of this experiment that differ from each method's reference, with the reason."""
    try:
        record = json.loads((tables.results_dir / "collect_report.json").read_text())
    except (OSError, TypeError, ValueError):
        record = {}
    if "provenance" not in record:
        return Note("Provenance", missing("the record of the experiment's provenance table"))
    summary = record["provenance"]
    if summary is None:
        return Note("No provenance table",
                    f"{tables.experiment} has no experiments/provenance/{tables.experiment}.yaml: its settings are "
                    "not claimed to follow a reference repository's (the real specs flux_main, sd35_main and "
                    "sana_main have one).")
    if summary.get("error"):
        return Note("Provenance table", f"experiments/provenance/{summary['table']} did not load when the results "
                    f"were collected: {summary['error']}", level="error")
    path = tables.results_dir / f"{PROVENANCE_TABLE}.parquet"
    data = pd.read_parquet(path) if path.is_file() else pd.DataFrame()
    note = Note("From the reference code",
                f"experiments/provenance/{summary['table']}: {summary['rows']} rows (one per setting and method group), "
                f"{len(data)} of them deviations; every other row is identical to its reference "
                "(tests/test_provenance.py checks the spec against the table). Grouped by reason:\n\n"
                + "\n".join(summary["bullets"]))
    return [note, Table("provenance_deviations", "Deviations from the references", data,
                        caption="reference: the reference's value; solbench: what the spec runs instead")]
