"""The head of a report: where its numbers come from, and which model and explore copy made them.

- the data hash (sha256 over the collected parquet files), the runs' git SHAs, run counts, arms, devices;
- per model, what names its weights (issue 42: a report never names its model only by "tiny"): the sha256 of
  the weights file, the width and the parameter count, as the experiment's fidelity runs recorded them when they
  loaded the same ``model.path`` as its training runs (solbench.fidelity.experiment.model_identity), or a line saying these
  results do not record them; and the explore copy the training runs sampled with: format and recipe, the share of
  the linear multiply-accumulates it ran in low precision (as a fidelity run of that recipe measured it) and the
  backend (solbench/report/explore.py);
- warnings: the spec's runs that were not collected, corrupt lines, mixed code versions, uncommitted code, runs
  that are not done.

The index opens with ``index_header`` (at most five lines: title, data hash, runs and code, links, each warning's
one-line summary); everything above goes to the report's provenance page (``provenance_lines``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import solbench
from solbench.report.explore import explore_runs, explore_text
from solbench.report.tables import Tables, _hashable


def _unique(runs: pd.DataFrame, column: str) -> list:
    if column not in runs:
        return []
    return list(dict.fromkeys(v for v in runs[column].map(_hashable) if v is not None))


def _path_text(paths: list) -> str:
    return " / ".join(f"`{p}`" for p in paths) if paths else "the shipped weights (solbench/assets)"


def model_lines(tables: Tables) -> list[tuple[str, str]]:
    """(row title, cell) per model: its weights and its explore copy (see the module docstring)."""
    rows = []
    for model in tables.models():
        train = tables.done_runs[tables.done_runs["model"] == model]
        fid = tables.fidelity_runs[tables.fidelity_runs["model"] == model]
        paths = _unique(train if len(train) else fid, "p_model.path")
        shas = _unique(fid, "p_model_identity.sha256")
        widths, params = _unique(fid, "p_model_identity.width"), _unique(fid, "p_model_identity.parameters")
        weights = _unique(fid, "p_model_identity.weights")
        same_path = set(map(str, _unique(fid, "p_model.path"))) == set(map(str, paths))
        parts = []
        if len(widths) == 1:
            parts.append(f"width {int(widths[0])}")
        if len(params) == 1:
            parts.append(f"{int(params[0]):,} transformer parameters")
        if len(shas) == 1:
            where = f" (`{Path(str(weights[0])).name}`)" if len(weights) == 1 else ""
            parts.append(f"weights{where} sha256 `{shas[0]}`, as its fidelity runs recorded it"
                         + (", which load the training runs' model.path" if len(train) and same_path else ""))
        elif len(shas) > 1:
            parts.append(f"**{len(shas)} different weights** among its fidelity runs (sha256 "
                         + ", ".join(f"`{h[:16]}`" for h in shas) + ")")
        else:
            parts.append("weights sha256 and width not recorded in these results (no fidelity run recorded them; "
                         "training runs do not)")
        parts.append(f"model.path: {_path_text(paths)}")
        rows.append((f"model `{model}`", "; ".join(parts)))
        explored = explore_runs(tables)
        explored = explored[explored["model"] == model]
        if len(explored):
            methods = ", ".join(dict.fromkeys(explored["method_display"]))
            rows.append((f"explore copy (`{model}`)", f"{explore_text(explored, with_share=fid)} ({methods})"))
    return rows


def _code_text(tables: Tables) -> str:
    shas = tables.git_shas()
    code = ", ".join(f"`{s[:12]}`" for s in shas) if shas else "unknown"
    if "dirty" in tables.runs and tables.runs["dirty"].fillna(False).astype(bool).any():
        code += " (some runs with uncommitted changes)"
    return code


def _runs_text(tables: Tables) -> str:
    status = tables.runs["status"].value_counts()
    return f"{len(tables.runs)} ({', '.join(f'{int(v)} {k}' for k, v in status.items())})"


def warnings_of(tables: Tables, missing: list[str]) -> list[str]:
    """Every warning of the report: what the collected tables lack, then mixed or uncommitted code and runs not done."""
    return list(missing) + tables.provenance_warnings()


def warning_summary(warning: str) -> str:
    """A warning in one line: its first line, and the items listed under it joined with '; '."""
    first, *rest = [line.strip() for line in warning.split("\n") if line.strip()]
    items = "; ".join(line.lstrip("- ").strip() for line in rest)
    return f"{first} {items}" if items else first


def index_header(tables: Tables, results_dir: Path, missing: list[str]) -> list[str]:
    """The report's head in at most five lines: title, where the numbers come from (data hash, runs, code), links to
    the provenance, glossary and arms pages, and each warning's one-line summary."""
    lines = [f"# solbench report: `{tables.experiment}`", "",
             f"From `{results_dir}` alone (solbench {solbench.__version__}): runs {_runs_text(tables)}, data "
             f"`sha256:{tables.data_hash[:16]}`, code {_code_text(tables)}; layout of the Sol-RL paper (arXiv "
             "2604.06916). [Provenance](provenance.md) · [arms and their settings](arms.md) · [glossary](glossary.md)",
             ""]
    warnings = warnings_of(tables, missing)
    if warnings:
        lines += [" ".join(f"> **Warning.** {warning_summary(w)}" if i == 0
                           else f"**Warning.** {warning_summary(w)}" for i, w in enumerate(warnings)) + " ([details](provenance.md#warnings))", ""]
    return lines


def provenance_lines(tables: Tables, results_dir: Path, missing: list[str]) -> list[str]:
    """The provenance page: the data hash, the runs' git SHAs, run counts, models and explore copies, methods,
    devices, and every warning in full."""
    arms = ", ".join(tables.arm_order())
    devices = ", ".join(sorted(tables.device_kinds())) or "not recorded"
    lines = [
        f"# Provenance: `{tables.experiment}`",
        "",
        f"[Back to the report](index.md). Regenerated from the collected tables in `{results_dir}` alone by "
        f"`solbench report` (solbench {solbench.__version__}). Layout follows the Sol-RL paper (arXiv 2604.06916): "
        "each caption names the paper table it mirrors. Intervals are 95% unless stated; *n seeds* is the number "
        "of independent runs behind a number.",
        "",
        "| | |",
        "|---|---|",
        f"| data hash | `sha256:{tables.data_hash[:16]}` (sha256 over the collected parquet files) |",
        f"| code (git SHA of the runs) | {_code_text(tables)} |",
        f"| runs | {_runs_text(tables)} |",
        f"| models | {', '.join(tables.models())} |",
        *[f"| {title} | {cell} |" for title, cell in model_lines(tables)],
        f"| methods | {arms} |",
        f"| devices | {devices} |",
        "",
        "## Warnings",
        "",
    ]
    warnings = warnings_of(tables, missing)
    if not warnings:
        lines += ["None: every run is done, from one committed code version, and every collected row was read.", ""]
    for warning in warnings:
        first, *rest = warning.split("\n")
        lines += [f"> **Warning.** {first}"] + (["> "] + [f"> {line}" for line in rest] if rest else []) + [""]
    return lines
