"""Provenance: where a real spec differs from the reference code, from its provenance table.

A real spec (flux_main, sd35_main, sana_main) has experiments/provenance/<name>.yaml: every setting a
reference fixes, with its source, and the deviations with their reasons (solbench.provenance; the
test suite checks the table against the spec). This section lists the deviations, so a reader of the
results sees what the runs did differently from each method's reference; experiments without a table
(the embedded world) get a note saying none is claimed.
"""

from __future__ import annotations

import json

import pandas as pd

from solbench.report.registry import Note, Table, report_kind
from solbench.report.tables import Tables


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


@report_kind("provenance", title="Provenance: deviations from the reference code", order=90)
def provenance_section(tables: Tables):
    """Settings of this experiment that differ from each method's reference, with the reason."""
    from solbench.provenance import find_table, load_table

    path = find_table(tables.experiment)
    if path is None:
        return Note("No provenance table",
                    f"{tables.experiment} has no experiments/provenance/{tables.experiment}.yaml: its settings are "
                    "not claimed to follow a reference repository's (the real specs flux_main, sd35_main and "
                    "sana_main have one).")
    table = load_table(path, None)
    rows = [{"setting": r.setting, "methods": ", ".join(r.methods), "reference": _show(r.value),
             "solbench": _show(r.solbench), "reason": r.deviation, "source": f"{r.ref} {r.file}: {r.at}"}
            for r in table.deviations()]
    summary = Note("From the reference code",
                   f"experiments/provenance/{path.name}: {len(table.rows)} rows (one per setting and method group), "
                   f"{len(rows)} of them deviations; every other row is identical to its reference "
                   "(tests/test_provenance.py checks the spec against the table). Grouped by reason:\n\n"
                   + "\n".join(table.deviation_bullets()))
    data = pd.DataFrame(rows, columns=["setting", "methods", "reference", "solbench", "reason", "source"])
    return [summary, Table("provenance_deviations", "Deviations from the references", data,
                           caption="reference: the reference's value; solbench: what the spec runs instead")]
