"""Writing a report: run every report kind on an experiment's tables, write Markdown, HTML, CSV and PNG.

``write_report(spec_or_experiment)`` resolves the experiment (a spec YAML file, an experiment name
or a results folder), loads ``results/<experiment>/*.parquet`` (``Tables.load``), calls every
registered report kind and writes ``reports/<experiment>/``:

- ``index.md``: the report, headed (solbench/report/header.py) with the data hash, the runs' git SHAs, the
  model (weights sha256, width) and its explore copy (recipe, format, share of the MACs, backend), and warnings for mixed
  code versions, uncommitted code, runs that are not done (which ones, and why they failed) and
  tables built from fewer rows or runs than the experiment has (``completeness_warnings``);
- ``index.html``: the same content as one static page, figures embedded (base64), no network;
- ``<table>.csv`` for every table (the tidy numbers, not the formatted cells) and ``<figure>.png``
  for every figure (with ``<figure>.csv`` holding the plotted numbers where the plugin gives them).

The folder is rebuilt in a temporary sibling and swapped in, so a report never mixes files of two
generations. A plugin that raises is reported in its section (and the run continues) unless
``strict=True``.
"""

from __future__ import annotations

import base64
import html
import logging
import math
import re
import shutil
import tempfile
import traceback
from pathlib import Path

import pandas as pd

from solbench.errors import ConfigError, SolbenchError
from solbench.report.registry import Figure, Note, Table, get_kind, kinds
from solbench.report.stats import fmt_num
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

        from solbench.spec.yaml_lines import non_utf8

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

    from solbench.spec import NAME_PATTERN

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
        markdown = _render(tables, sections, tmp, results_dir, missing)
        (tmp / "index.md").write_text(markdown)
        (tmp / "index.html").write_text(_html(markdown, tmp, experiment))
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
    collected (when a spec file is given), and collected runs whose folder has gone since."""
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
    if spec_arg != "SPEC":
        from solbench.spec import load_spec

        try:
            wanted = [run.run_id for run in load_spec(spec_arg).runs]
        except SolbenchError:
            wanted = []
        absent = [r for r in wanted if r not in collected]
        if absent:
            warnings.append(f"Built from {len(wanted) - len(absent)} of the spec's {len(wanted)} runs: "
                            f"{', '.join(absent)} were not collected (`solbench run {spec_arg}` runs what is "
                            "missing, then collects).")
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


# ---- Markdown --------------------------------------------------------------------------------------

def _cell(value) -> str:
    if isinstance(value, float):
        text = fmt_num(value) if math.isfinite(value) else "-"
    elif value is None or (not isinstance(value, str) and pd.isna(value)):
        text = "-"
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(frame: pd.DataFrame) -> str:
    """A pipe table (GitHub / Python-Markdown 'tables' syntax) of the frame's cells."""
    if frame.empty:
        return "*(empty)*"
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(_cell(c) for c in cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(_cell(v) for v in row.tolist()) + " |")
    return "\n".join(lines)


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _render(tables: Tables, sections, out_dir: Path, results_dir: Path, missing: list[str]) -> str:
    from solbench.report.header import header_lines

    lines = header_lines(tables, results_dir, missing)
    lines += ["## Contents", ""]
    for i, (kind, _) in enumerate(sections, 1):
        lines.append(f"{i}. [{kind.title}](#{_anchor(f'{i}. {kind.title}')})")
    lines.append("")
    used: set[str] = set()
    for i, (kind, outputs) in enumerate(sections, 1):
        lines += [f"## {i}. {kind.title}", ""]
        if kind.description:
            lines += [f"*{kind.description}*", ""]
        if not outputs:
            lines += ["Nothing to show for these results.", ""]
        for out in outputs:
            lines += _render_output(out, out_dir, used)
    return "\n".join(lines).rstrip() + "\n"


def _unique(name: str, used: set[str]) -> str:
    base, i = name, 2
    while name in used:
        name, i = f"{base}_{i}", i + 1
    used.add(name)
    return name


def _render_output(out, out_dir: Path, used: set[str]) -> list[str]:
    if isinstance(out, Note):
        prefix = {"warning": "> **Warning.** ", "error": "> **Error.** "}.get(out.level, "> ")
        return [f"{prefix}**{out.title}:** {out.text}", ""]
    name = _unique(out.name, used)
    lines = [f"### {out.title}", ""]
    if isinstance(out, Table):
        out.data.to_csv(out_dir / f"{name}.csv", index=False)
        display = out.display if out.display is not None else out.data
        lines += [markdown_table(display), ""]
        if out.caption:
            lines += [f"*{out.caption}*", ""]
        lines += [f"Numbers: [{name}.csv]({name}.csv)", ""]
    else:
        out.figure.savefig(out_dir / f"{name}.png", dpi=110)
        lines += [f"![{out.title}]({name}.png)", ""]
        if out.caption:
            lines += [f"*{out.caption}*", ""]
        if out.data is not None:
            out.data.to_csv(out_dir / f"{name}.csv", index=False)
            lines += [f"Plotted numbers: [{name}.csv]({name}.csv)", ""]
    return lines


# ---- HTML ------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; border: 1px solid #eee; }
blockquote { border-left: 4px solid #e0a000; background: #fff8e5; margin: 1em 0; padding: 0.4em 1em; }
code { background: #f4f4f4; padding: 0 0.2em; }
em { color: #444; }
"""


def _html(markdown_text: str, out_dir: Path, title: str) -> str:
    try:
        import markdown as md

        body = md.markdown(markdown_text, extensions=["tables", "toc"])
    except ImportError:  # pragma: no cover - markdown ships with tensorboard; keep a fallback anyway
        body = _minimal_html(markdown_text)

    def embed(match: re.Match) -> str:
        src = html.unescape(match.group(2))
        path = out_dir / src
        if not path.is_file() or "/" in src:
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f'{match.group(1)}data:image/png;base64,{data}"'

    body = re.sub(r'(<img[^>]*?src=")([^"]+\.png)"', embed, body)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>solbench report: {html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")


def _minimal_html(text: str) -> str:
    """Headings, paragraphs, block quotes, pipe tables and images; enough for our own Markdown."""
    out, table = [], []

    def inline(s: str) -> str:
        s = html.escape(s)
        s = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r'<img alt="\1" src="\2">', s)
        s = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r'<a href="\2">\1</a>', s)
        s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
        s = re.sub(r"\*([^*]+)\*", r"<em>\1</em>", s)
        return re.sub(r"`([^`]+)`", r"<code>\1</code>", s)

    def flush():
        if table:
            rows = [r for r in table if not re.match(r"^\|[-|: ]+\|$", r)]
            cells = [[c.strip() for c in re.split(r"(?<!\\)\|", r.strip())[1:-1]] for r in rows]
            head = "".join(f"<th>{inline(c)}</th>" for c in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>" for r in cells[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            table.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush()
        if m := re.match(r"^(#{1,6}) (.*)", line):
            level = len(m.group(1))
            out.append(f'<h{level} id="{_anchor(m.group(2))}">{inline(m.group(2))}</h{level}>')
        elif line.startswith("> "):
            out.append(f"<blockquote>{inline(line[2:])}</blockquote>")
        elif line.strip():
            out.append(f"<p>{inline(line)}</p>")
    flush()
    return "\n".join(out)
