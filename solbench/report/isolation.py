"""The report section of what isolates FP4 (issue 54): the decomposition naive BF16 scaling -> full-precision-preview
twin -> Sol-RL (solbench/report/findings_twin.py), Table 1 at equal measured and projected time with the projection's
sensitivity to the FP4 rate (solbench/report/equal_time.py), and the multiplicity of the Findings (Holm over the
primaries, the exploratory rows counted as hypotheses: solbench/report/findings_multiplicity.py). Its numbers are
the Findings rows' (findings.csv); reads stored results only.
"""

from __future__ import annotations

from solbench.report.registry import report_kind
from solbench.report.tables import Tables


@report_kind("fp4_isolation", title="What FP4 itself does: the twin, equal time, multiplicity", order=2)
def fp4_isolation(tables: Tables):
    """The decomposition, Table 1 at equal time (measured, projected, FP4 rate 2-4x) and the multiplicity note."""
    from solbench.report.equal_time import table1_equal_time
    from solbench.report.findings import collect_findings
    from solbench.report.findings_multiplicity import family_note
    from solbench.report.findings_twin import decomposition_table

    return [decomposition_table(tables), table1_equal_time(tables), family_note(tables, collect_findings(tables))]
