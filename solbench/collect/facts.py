"""The facts ``collect`` adds beside the runs' own tables (solbench.results.stored_facts names them and their
schema):

- ``recorded_run_facts(store, spec, explores)``: a run's own facts.json at this schema, else computed now from its
  spec.json (solbench.train.facts.run_facts, what the trainer records when a run starts);
- ``paper_model_facts()``: the paper models' facts (the committed asset solbench.measure.paper_models writes,
  ``PAPER_MODEL_ASSET``) as the table collect writes beside the runs;
- ``provenance_record(experiment)``: the deviations of the experiment's provenance table (solbench.provenance).
"""

from __future__ import annotations

import json
from typing import Any

from solbench.results.stored_facts import (BACKENDS_FACT, FACTS_SCHEMA, METHOD_FACTS, PAPER_MODEL_ASSET, RUN_FACTS,
                                           SCHEMA_COLUMN)
from solbench.train.facts import FACTS_FILE, method_facts, quant_backends_fact, run_facts


def recorded_run_facts(store, spec: dict, explores: bool) -> dict[str, Any]:
    """The facts the run recorded when it started (facts.json), when they are of this schema; else computed now
    from its spec.json (a run that predates them, or an older schema)."""
    own = store.read_json(FACTS_FILE)
    if (isinstance(own, dict) and own.get(SCHEMA_COLUMN) == FACTS_SCHEMA
            and set(RUN_FACTS) - {BACKENDS_FACT, *METHOD_FACTS} <= set(own)):
        facts = {SCHEMA_COLUMN: FACTS_SCHEMA, **{column: own.get(column) for column in RUN_FACTS}}
        if facts[BACKENDS_FACT] is None:  # facts.json written before the backends were recorded: the registry's now
            facts[BACKENDS_FACT] = quant_backends_fact()
        if any(facts[column] is None for column in METHOD_FACTS):  # written before methods declared them
            facts.update(method_facts(spec.get("method")))  # none for a method not installed here: the report's table
        return facts
    return run_facts(spec, explores=explores)


def paper_model_facts():
    """The paper models' facts table (pandas), from the committed asset solbench.measure.paper_models writes."""
    import pandas as pd

    data = json.loads(PAPER_MODEL_ASSET.read_text())
    return pd.DataFrame(data["models"])


PROVENANCE_COLUMNS = ["setting", "methods", "reference", "solbench", "reason", "source"]


def _show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def provenance_record(experiment: str):
    """(summary, deviations table) of the experiment's provenance table (experiments/provenance/<name>.yaml,
    solbench.provenance), which the report lists: summary {"table", "rows", "bullets"} (None: the experiment
    has none; {"error"}: it does not load) and one row per deviation (None without a table)."""
    import pandas as pd

    from solbench.provenance import find_table, load_table

    path = find_table(experiment)
    if path is None:
        return None, None
    try:
        table = load_table(path, None)
    except Exception as err:  # noqa: BLE001 - a broken table is said in the report, not a failed collect
        return {"table": path.name, "error": f"{type(err).__name__}: {err}"}, None
    rows = [{"setting": r.setting, "methods": ", ".join(r.methods), "reference": _show(r.value),
             "solbench": _show(r.solbench), "reason": r.deviation, "source": f"{r.ref} {r.file}: {r.at}"}
            for r in table.deviations()]
    summary = {"table": path.name, "rows": len(table.rows), "bullets": list(table.deviation_bullets())}
    return summary, pd.DataFrame(rows, columns=PROVENANCE_COLUMNS)
