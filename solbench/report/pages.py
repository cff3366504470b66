"""The report's pages: a first page a researcher reads in a minute, and the detail it links to.

- ``index.md``: a header of at most five lines (solbench/report/header.py), "The answers" (solbench/report/
  answers.py: is Sol-RL faster, is it as good as full-precision training, then the primary claims), the headline
  figure (solbench/report/headline.py), the paper's tables in the paper's shape (solbench/report/paper_tables.py)
  and links to everything else;
- ``findings.md``: the findings kind in full (every claim on every reward, power, what each interval covers);
- ``details.md``: every other report kind in full, in section order, with its contents;
- ``arms.md``: each short arm label (solbench/report/labels.py) and the full settings it stands for;
- ``provenance.md``: data hash, code versions, models, explore copies, devices and every warning in full;
- ``glossary.md``: the jargon (solbench/report/glossary.py); each page links its first use of a term to it.

Pages name arms by their short labels; the CSVs keep the full labels (arms.md maps one to the other).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from solbench.report.glossary import GLOSSARY_PAGE, glossary_page, link_terms
from solbench.report.labels import arm_settings, relabel, short_labels
from solbench.report.registry import Figure, Note, Table
from solbench.report.tables import Tables

INDEX, FINDINGS, DETAILS, ARMS, PROVENANCE = "index.md", "findings.md", "details.md", "arms.md", "provenance.md"


def _tables_named(sections, prefix: str) -> list[Table]:
    return [out for _, outputs in sections for out in outputs
            if isinstance(out, Table) and (out.name == prefix or out.name.startswith(prefix + "_"))]


def _data(sections, name: str) -> pd.DataFrame | None:
    found = [t for t in _tables_named(sections, name) if t.name == name]
    return found[0].data if found else None


def _section_lines(sections, out_dir: Path, used: set[str], keep) -> tuple[list[str], list[str]]:
    """(contents lines, section lines) of the sections ``keep`` selects, numbered in report order."""
    from solbench.report.render import anchor, render_output

    contents, body = [], []
    for i, (kind, outputs) in enumerate(sections, 1):
        if not keep(kind):
            continue
        title = f"{i}. {kind.title}"
        contents.append((title, anchor(title)))
        body += [f"## {title}", ""]
        if kind.description:
            body += [f"*{kind.description}*", ""]
        if not outputs:
            body += ["Nothing to show for these results.", ""]
        for out in outputs:
            if kind.name == "findings" and isinstance(out, Table) and out.name == "findings":
                body += _narrow_findings(out, out_dir, used)
            else:
                body += render_output(out, out_dir, used)
    return contents, body


#: the findings table's columns that stay in the table; the others are listed under it, one entry per claim
FINDINGS_TABLE_COLUMNS = ("primary", "claim", "reward", "measured", "interval", "verdict", "overall")


def _narrow_findings(table: Table, out_dir: Path, used: set[str]) -> list[str]:
    """The findings table with its short columns only, then each claim's other cells (paper figure, what the
    interval covers, rule, power, other rewards, recipe, details) as a list: no table line runs to thousands of
    characters. The CSV keeps every column."""
    from solbench.report.render import neutral, render_output

    display = table.display if table.display is not None else table.data
    keep = [c for c in display.columns if any(str(c).endswith(k) or str(c) == k for k in FINDINGS_TABLE_COLUMNS)]
    rest = [c for c in display.columns if c not in keep]
    narrow = Table(table.name, table.title, table.data, table.caption, display=display[keep])
    lines = render_output(narrow, out_dir, used)
    if rest:
        lines += ["### Each claim in full", ""]
        for _, row in display.iterrows():
            cells = "; ".join(f"{c}: {neutral(row[c])}" for c in rest if str(row[c]).strip() not in ("", "-"))
            lines.append(f"- **{neutral(row['claim'])}** ({neutral(row.get('reward', '-'))}): {cells}")
        lines.append("")
    return lines


def _paper_tables(tables: Tables, sections, labels: dict[str, str]) -> list[str]:
    from solbench.report import paper_tables as pt
    from solbench.report.render import markdown_table

    lines = ["## The paper's tables", ""]
    shown = False

    def add(title: str, frame: pd.DataFrame, caption: str, csv: str) -> None:
        nonlocal shown
        if frame is None or frame.empty:
            return
        shown = True
        lines.extend([f"### {title}", "", markdown_table(frame), "", f"*{caption}* Numbers: [{csv}]({csv})", ""])

    for model in tables.models():
        name = f"main_results_{model}"
        add(f"Table 1: main results, {model}", pt.table1(tables, _data(sections, name), labels, model),
            "Each method's main arm at Table 1's step (the reference arm's last evaluation: equal iterations): mean "
            "±half-width of the 95 % t interval over run seeds, and Δ against the base (the run's own step 0). Every "
            "arm, and the comparison with DiffusionNFT at equal projected GPU time: the details.", f"{name}.csv")
    add("Table 5: seconds per iteration, naive BF16 scaling vs Sol-RL",
        pt.table5(tables, _data(sections, "timing_table5"), labels),
        "Measured on these runs' own clock (median per run after warm-up, mean ±95 % t half-width over run seeds); "
        "speedups with the 95 % t interval of the log ratio; the paper's rows are its 8x B200 clock. Every Sol-RL "
        "arm and each phase: the details.",
        "timing_table5.csv")
    for model in tables.models():
        name = f"ablations_{model}_sol_rl"
        for paper, axis, column in pt.ABLATION_AXES:
            add(f"{paper}: Sol-RL by {column}, {model}",
                pt.ablation_table(tables, _data(sections, name), labels, model, axis, column),
                f"One row per setting, the other settings at Sol-RL's defaults: every reward at the step read, mean "
                "±95 % t half-width over run seeds.", f"{name}.csv")
    add("Table 8: ranking fidelity, explore copy against full precision",
        pt.table8(_data(sections, "ranking_fidelity"), labels, tables.options.top_k),
        "Spearman ρ and Kendall τ of the explore copy's ranking of a prompt's seeds against full precision's, mean "
        "[95 % interval] over prompts, all seeds; hit@K (chance in brackets).", "ranking_fidelity.csv")
    return lines if shown else []


def _headline(tables: Tables, sections, labels: dict[str, str], out_dir: Path, used: set[str]) -> list[str]:
    from solbench.report.headline import headline_figure
    from solbench.report.render import render_output

    figure = headline_figure(tables, _data(sections, "timing_table5"), labels,
                             speed_table=_data(sections, "speed_block"))
    if figure is None:
        return []
    try:
        return render_output(figure, out_dir, used)
    finally:
        figure.figure.clear()


#: the sweep's one-sentence answer (solbench/report/sweep_answer.py) and the figures the index shows beside it
SWEEP_ANSWER = "Sweep: the answer"
SWEEP_FIGURES = ("sweep_heatmap", "sweep_front")


def _note(sections, title: str) -> Note | None:
    found = [out for _, outputs in sections for out in outputs if isinstance(out, Note) and out.title == title]
    return found[0] if found else None


def _sweep_figures(sections, contents) -> list[str]:
    """A sweep's heat map and measured front on the first page, under its answer (their PNGs are the ones the
    details page writes: the details section renders first), each with a link to its section."""
    from solbench.report.render import neutral

    lines = []
    for i, (kind, outputs) in enumerate(sections, 1):
        for out in outputs:
            if isinstance(out, Figure) and out.name in SWEEP_FIGURES and out.written:
                anchor = next((a for title, a in contents if title == f"{i}. {kind.title}"), "")
                lines += [f"### {neutral(out.title)}", "", f"![{neutral(out.title)}]({out.written}.png)", "",
                          f"*Details, intervals and the numbers: [{neutral(kind.title)}]({DETAILS}#{anchor}).*", ""]
    return lines


def _findings_frame(sections) -> pd.DataFrame | None:
    found = [t for t in _tables_named(sections, "findings") if t.name == "findings"]
    return found[0].data if found else None


def _clock(tables: Tables) -> str:
    devices = ", ".join(sorted(tables.device_kinds())) or "a device not recorded"
    return f"these runs' wall clock on {devices}"


def _horizon(tables: Tables) -> str:
    """'medians over 32 iterations, 1 warm-up iteration dropped': the horizon of Table 5's arms (the main arms of
    the target and baseline methods), '' where the runs do not record it."""
    from solbench.report.findings_common import main_arm
    from solbench.report.tables import HORIZON

    runs = tables.done_runs
    parts = []
    for method in (tables.options.target_method, tables.options.baseline_method):
        arm = main_arm(tables, runs, method)
        if arm is None or HORIZON not in runs:
            return ""
        iterations = pd.to_numeric(runs.loc[runs["arm"] == arm, HORIZON], errors="coerce").dropna()
        if iterations.empty:
            return ""
        parts.append(int(iterations.max()))
    its = f"{parts[0]}" if parts[0] == parts[1] else f"{parts[0]} and {parts[1]}"
    warm = tables.options.warmup
    return f"medians over {its} iterations, {warm} warm-up iteration{'s' if warm != 1 else ''} dropped"


def build_pages(tables: Tables, sections, out_dir: Path, results_dir: Path, missing: list[str]) -> dict[str, str]:
    """{page file name: Markdown} of the report (module docstring); writes the CSVs and PNGs into ``out_dir``."""
    from solbench.report.answers import answer_lines
    from solbench.report.header import index_header, provenance_lines
    from solbench.report.render import markdown_table

    labels = short_labels(tables)
    used: set[str] = set()
    experiment = tables.experiment
    back = ["[Back to the report](index.md)", ""]

    _, findings_body = _section_lines(sections, out_dir, used, lambda k: k.name == "findings")
    detail_contents, detail_body = _section_lines(sections, out_dir, used, lambda k: k.name != "findings")

    index = index_header(tables, results_dir, missing)
    sweep = _note(sections, SWEEP_ANSWER)
    index += answer_lines(_findings_frame(sections), labels, _clock(tables), _horizon(tables),
                          sweep=sweep.text if sweep is not None else None)
    index += _sweep_figures(sections, detail_contents)
    if sweep is None:  # a sweep's front is its headline: reward against measured time, one point a cell
        index += _headline(tables, sections, labels, out_dir, used)
    index += _paper_tables(tables, sections, labels)
    index += ["## Everything else", ""]
    if findings_body:
        index.append(f"- [Findings]({FINDINGS}): every claim on every reward, its interval and what it covers, the "
                     "verdict, power and each run seed's difference")
    if detail_contents:
        index.append(f"- [Details]({DETAILS}), every section in full:")
        index += [f"  - [{title}]({DETAILS}#{anchor})" for title, anchor in detail_contents]
    index += [f"- [Arms]({ARMS}): each short label and the full settings it stands for",
              f"- [Provenance]({PROVENANCE}): data hash, code versions, model weights, explore copies, warnings",
              f"- [Glossary]({GLOSSARY_PAGE}): the verdict rule, interval kinds, mde and the rest", ""]

    pages = {INDEX: index}
    if findings_body:
        pages[FINDINGS] = [f"# Findings: `{experiment}`", "", *back, *findings_body]
    details = [f"# Details: `{experiment}`", "", *back, "## Contents", ""]
    details += [f"- [{title}](#{anchor})" for title, anchor in detail_contents] + [""] + detail_body
    pages[DETAILS] = details
    arms = arm_settings(tables)
    pages[ARMS] = [f"# Arms: `{experiment}`", "", *back,
                   "Each arm's short label (used on every page) and the settings that tell it apart from the other "
                   "arms of its method; the CSVs name arms by their full label (last column).", "",
                   markdown_table(arms) if not arms.empty else "*(no runs)*", ""]
    pages[PROVENANCE] = provenance_lines(tables, results_dir, missing) + back
    texts = {name: relabel("\n".join(lines).rstrip() + "\n", labels) for name, lines in pages.items()
             if name != ARMS}
    texts[ARMS] = "\n".join(pages[ARMS]).rstrip() + "\n"  # the one page that names both labels
    texts = {name: link_terms(text) for name, text in texts.items()}
    texts[GLOSSARY_PAGE] = glossary_page(experiment)
    return texts


def html_links(markdown: str) -> str:
    """The Markdown of a page's HTML twin: links to the report's own .md pages point at their .html twins."""
    import re

    pages = "|".join(re.escape(p[: -len(".md")]) for p in (INDEX, FINDINGS, DETAILS, ARMS, PROVENANCE, GLOSSARY_PAGE))
    return re.sub(rf"\]\(({pages})\.md(#[^)]*)?\)", lambda m: f"]({m.group(1)}.html{m.group(2) or ''})", markdown)
