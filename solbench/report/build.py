"""Writing a report: run every report kind on an experiment's tables, write Markdown, HTML, CSV and PNG.

``write_report(spec_or_experiment)`` resolves the experiment (a spec YAML file, an experiment name
or a results folder), loads ``results/<experiment>/*.parquet`` (``Tables.load``), calls every
registered report kind and writes ``reports/<experiment>/``:

- ``index.md``: the first page (solbench/report/pages.py): a header of at most five lines (data hash, runs, code,
  each warning's one-line summary), the two answers and the primary claims, the headline figure, the paper's tables
  in the paper's shape, and links to ``findings.md``, ``details.md`` (every other report kind in full), ``arms.md``
  (short arm labels and their settings), ``provenance.md`` (the full header: model weights, explore copy, warnings
  for mixed code versions, uncommitted code, runs not done and tables built from fewer rows or runs than the
  experiment has, ``completeness_warnings``) and ``glossary.md``;
- an ``.html`` twin of every page: the same content, figures embedded (base64), no network;
- ``<table>.csv`` for every table (the tidy numbers, not the formatted cells) and ``<figure>.png``
  for every figure (with ``<figure>.csv`` holding the plotted numbers where the plugin gives them).

The folder is rebuilt in a temporary sibling and swapped in, so a report never mixes files of two
generations. A plugin that raises is reported in its section (and the run continues) unless
``strict=True``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import traceback
from pathlib import Path

from solbench.errors import ConfigError, SolbenchError
from solbench.report.registry import Figure, Note, get_kind, kinds
from solbench.report.pages import build_pages, html_links
from solbench.report.render import to_html as _html
from solbench.report.tables import ReportOptions, Tables

log = logging.getLogger(__name__)


def resolve_experiment(spec_or_experiment: str | Path, results_root: str | Path = "results") -> tuple[str, Path, dict]:
    """(experiment name, results folder, the spec's ``report:`` mapping) for a spec, name or folder."""
    target = Path(spec_or_experiment)
    results_root = Path(results_root)
    if target.suffix in (".yaml", ".yml"):
        if not target.is_file():
            raise ConfigError(f"{target}: no such spec file")
        import yaml

        from solbench.text.spec_text import non_utf8

        try:
            data = yaml.safe_load(target.read_text(encoding="utf-8")) or {}
        except UnicodeDecodeError as err:
            raise ConfigError(non_utf8(target, err)) from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{target}: not valid YAML ({err})") from err
        if not isinstance(data, dict):
            raise ConfigError(f"{target}: a spec must be a YAML mapping")
        name = data.get("experiment") or data.get("name") or target.stem
        report = data.get("report") or {}
        if not isinstance(report, dict):
            raise ConfigError(f"{target}: `report` must be a mapping of report options")
        _check_name(str(name), f"{target}: name")
        return str(name), results_root / str(name), report
    if target.is_dir() and (target / "runs.parquet").exists():
        _check_name(target.resolve().name, f"{target}: the results folder's name")
        return target.resolve().name, target, {}
    _check_name(str(spec_or_experiment), "experiment")
    folder = results_root / str(spec_or_experiment)
    if not folder.is_dir():
        raise SolbenchError(f"no results for experiment {str(spec_or_experiment)!r}: {folder} does not exist "
                            "(give a spec file, an experiment name under --results, or a results folder)")
    return str(spec_or_experiment), folder, {}


def _check_name(name: str, where: str) -> None:
    """The report folder is reports/<name>: a name outside the spec names' pattern (``..``, a path, an absolute
    name) would write it outside the reports root, so it is refused in one line."""
    import re

    from solbench.text.spec_text import NAME_PATTERN

    if not re.match(NAME_PATTERN, name):
        raise ConfigError(f"{where}: {name!r} is not an experiment name (letters, digits, '_', '.', '-', starting "
                          "with a letter or digit): the report folder reports/<name> must stay inside the reports root")


def write_report(spec_or_experiment: str | Path, results_root: str | Path = "results",
                 reports_root: str | Path = "reports", *, options: ReportOptions | None = None,
                 strict: bool = False) -> Path:
    """Write reports/<experiment>/ from results/<experiment>/*.parquet; return the path of index.md.

    ``options`` default to the spec's ``report:`` mapping (when a spec file is given), else to
    ``ReportOptions()``. With ``strict`` a failing report kind raises instead of being reported.
    """
    experiment, results_dir, spec_options = resolve_experiment(spec_or_experiment, results_root)
    if options is None:
        options = ReportOptions.from_mapping(spec_options, where=f"{spec_or_experiment}: report")
    tables = Tables.load(results_dir, options)
    missing = completeness_warnings(spec_or_experiment, results_dir, tables.runs["run_id"])
    selected = [get_kind(k) for k in options.kinds] if options.kinds else kinds()
    sections = []
    for kind in selected:
        try:
            outputs = kind(tables)
        except Exception as err:  # noqa: BLE001 - one broken plugin must not hide the others
            if strict:
                raise
            log.error("report kind %s failed:\n%s", kind.name, traceback.format_exc())
            outputs = [Note(kind.title, f"This section failed to render: {type(err).__name__}: {err}", level="error")]
        sections.append((kind, outputs))

    final_dir = Path(reports_root) / experiment
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{experiment}.", dir=final_dir.parent))
    try:
        for page, markdown in build_pages(tables, sections, tmp, results_dir, missing).items():
            (tmp / page).write_text(markdown)  # index.md and the pages it links (solbench/report/pages.py)
            (tmp / page).with_suffix(".html").write_text(_html(html_links(markdown), tmp, experiment))
        _swap_in(tmp, final_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        _close_figures(sections)
    return final_dir / "index.md"


def completeness_warnings(spec_or_experiment: str | Path, results_dir: Path, collected_run_ids) -> list[str]:
    """What the collected tables lack, for the report's header and `solbench report`: table lines
    skipped as corrupt when collecting (collect_report.json), runs of the spec that were not
    collected (those the last collect was asked for), collected runs whose folder has gone since, and
    facts the tables predate (solbench.report.stored)."""
    import json

    warnings = []
    spec_arg = str(spec_or_experiment) if Path(spec_or_experiment).suffix in (".yaml", ".yml") else "SPEC"
    try:
        corrupt = json.loads((results_dir / "collect_report.json").read_text()).get("corrupt_lines") or []
    except (OSError, ValueError):
        corrupt = []
    if corrupt:
        files = sorted({bad["path"] for bad in corrupt})
        warnings.append(f"Built from fewer rows than the runs wrote: {len(corrupt)} corrupt line(s) of "
                        f"{', '.join(files)} were skipped when collecting (listed in collect_report.json). "
                        f"`solbench status {spec_arg}` names each line and the command that rewrites it.")
    collected = {str(r) for r in collected_run_ids}
    from solbench.report.stored import stale_facts_warnings, uncollected_runs_warnings

    # from what collect recorded, not the spec: the report reads stored results alone
    warnings += uncollected_runs_warnings(results_dir, collected, spec_arg) + stale_facts_warnings(results_dir, spec_arg)
    gone = sorted(r for r in collected if not (results_dir / r).is_dir())
    if gone:
        warnings.append(f"The collected tables hold {len(gone)} run(s) whose folder is gone from {results_dir}: "
                        f"{', '.join(gone)}. `solbench run {spec_arg}` runs them again and collects; "
                        f"`solbench collect {spec_arg}` drops them.")
    return warnings


def _swap_in(tmp: Path, final_dir: Path) -> None:
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        final_dir.rename(old)
    tmp.rename(final_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _close_figures(sections) -> None:
    for _, outputs in sections:
        for out in outputs:
            if isinstance(out, Figure):
                out.figure.clear()
