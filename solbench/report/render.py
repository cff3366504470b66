"""Turning report outputs into Markdown, and the Markdown into one static HTML page that runs nothing.

A report quotes strings it did not write: arm and metric names and settings from specs, prompt texts and skills
from prompt files, error messages from runs' status.json (which may come from someone else's machine). They go
into the Markdown through the helpers here, and the HTML page is made from that Markdown by ``to_html``:

- ``neutral(text)``: HTML's special characters as entities (``&``, ``<``, ``>``), newlines folded to spaces, and
  the text clipped to a bound (``solbench.text.bounded_text.clip``: '...' and its length), so a 10 MB error message
  costs a few hundred characters. The writer's own Markdown (``**bold**``, ``code``, links) still works: it has
  none of these characters.
- ``cell(value)``: a table cell: numbers formatted (``fmt_num``), missing values as ``-``, then ``neutral`` with the
  cell bound, and ``|`` escaped so that it cannot end the cell.
- ``markdown_table(frame)`` and ``render_output(output, ...)``: a plugin's Table, Figure or Note as Markdown lines
  (titles, captions and notes neutralised too).
- ``to_html(markdown, folder, title)``: python-markdown with raw HTML refused (its raw-HTML block preprocessor and
  inline pattern are deregistered, so ``<script>`` stays text), and a tree pass that keeps only what the writer
  emits: images are the report folder's own PNG files (embedded as base64, no network), anything else becomes its
  alt text; links go to anchors, relative paths or http(s)/mailto (a ``javascript:`` link loses its href); only the
  attributes python-markdown writes for our Markdown survive; every table sits in a horizontally scrolling block of
  its own, so a wide table never makes the page itself scroll sideways.
"""

from __future__ import annotations

import base64
import html
import math
import re
import xml.etree.ElementTree as etree
from pathlib import Path

import markdown
import pandas as pd
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor

from solbench.report.inert import neutral  # noqa: F401  (pages.py quotes through render)
from solbench.report.registry import Note, Table
from solbench.report.stats import fmt_num

CELL_CHARS = 400  # a table cell's bound (the findings' longest cells are about 2,000 characters of our own text)
TITLE_CHARS = 200  # a title's bound (headings and figure alt text)



def cell(value, limit: int = CELL_CHARS) -> str:
    """One pipe-table cell: a number formatted, a missing value as '-', text neutralised and its pipes escaped."""
    if isinstance(value, float):
        text = fmt_num(value) if math.isfinite(value) else "-"
    elif value is None or (pd.api.types.is_scalar(value) and not isinstance(value, str) and pd.isna(value)):
        text = "-"
    else:
        text = value if isinstance(value, str) else str(value)
    # backslashes right before a pipe are doubled, so '\|' in the text cannot turn the escape into a cell break
    return re.sub(r"(\\*)\|", lambda m: m.group(1) * 2 + "\\|", neutral(text, limit))


def markdown_table(frame: pd.DataFrame, limit: int = CELL_CHARS) -> str:
    """A pipe table (GitHub / Python-Markdown 'tables' syntax) of the frame's cells, header included; ``limit``
    bounds each cell (a detail page of the writer's own long cells may pass more)."""
    if frame.empty:
        return "*(empty)*"
    lines = ["| " + " | ".join(cell(str(c), limit) for c in frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    for _, row in frame.iterrows():  # (a row as a Series: an all-number row's ints print as its floats do)
        lines.append("| " + " | ".join(cell(v, limit) for v in row.tolist()) + " |")
    return "\n".join(lines)


def anchor(text: str) -> str:
    """The id a heading gets in the HTML page (and the contents links to it)."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def unique(name: str, used: set[str]) -> str:
    """``name``, or ``name_2``, ``name_3``, ... when an earlier output of the report took it."""
    base, i = name, 2
    while name in used:
        name, i = f"{base}_{i}", i + 1
    used.add(name)
    return name


def _title(text) -> str:
    return neutral(text, TITLE_CHARS)


def render_output(out, out_dir: Path, used: set[str]) -> list[str]:
    """Markdown lines for one plugin output; writes its CSV (and PNG) into ``out_dir``."""
    if isinstance(out, Note):
        prefix = {"warning": "> **Warning.** ", "error": "> **Error.** "}.get(out.level, "> ")
        return [f"{prefix}**{_title(out.title)}:** {neutral(out.text)}", ""]
    name = unique(out.name, used)
    lines = [f"### {_title(out.title)}", ""]
    if isinstance(out, Table):
        out.data.to_csv(out_dir / f"{name}.csv", index=False)
        display = out.display if out.display is not None else out.data
        lines += [markdown_table(display), ""]
        if out.caption:
            lines += [f"*{neutral(out.caption)}*", ""]
        lines += [f"Numbers: [{name}.csv]({name}.csv)", ""]
    else:
        out.figure.savefig(out_dir / f"{name}.png", dpi=110)
        out.written = name
        alt = re.sub(r"([\[\]])", r"\\\1", _title(out.title))
        lines += [f"![{alt}]({name}.png)", ""]
        if out.caption:
            lines += [f"*{neutral(out.caption)}*", ""]
        if out.data is not None:
            out.data.to_csv(out_dir / f"{name}.csv", index=False)
            lines += [f"Plotted numbers: [{name}.csv]({name}.csv)", ""]
    return lines


# ---- HTML ------------------------------------------------------------------------------------------

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; max-width: 1200px; margin: 2em auto;
       padding: 0 1em; color: #222; line-height: 1.45; overflow-wrap: anywhere; }
.table-scroll { overflow-x: auto; max-width: 100%; margin: 0.8em 0; }
table { border-collapse: collapse; font-size: 0.88em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top;
         overflow-wrap: normal; min-width: 4em; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; height: auto; border: 1px solid #eee; }
blockquote { border-left: 4px solid #e0a000; background: #fff8e5; margin: 1em 0; padding: 0.4em 1em; }
code { background: #f4f4f4; padding: 0 0.2em; }
pre { overflow-x: auto; }
em { color: #444; }
"""

# What python-markdown writes for our Markdown (tables' alignment, toc's ids, links' titles) and what the tree
# pass below sets; anything else on an element is dropped.
_ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}, "div": {"class"}, "th": {"style", "align"},
               "td": {"style", "align"}}
_ANY_ELEMENT = {"id"}
_OWN_FIGURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.png")
_LINK_SCHEMES = {"http", "https", "mailto"}
_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*):")
_INVISIBLE = re.compile(r"[\x00-\x20\x7f]+")


def _safe_href(href: str) -> bool:
    """An anchor, a relative path or an http(s)/mailto URL, as a browser would read it (entities decoded, the
    control characters and spaces it ignores removed)."""
    seen = None
    while seen != href:  # '&amp;#58;' decodes to '&#58;' decodes to ':'
        seen, href = href, html.unescape(href)
    scheme = _SCHEME.match(_INVISIBLE.sub("", href))
    return scheme is None or scheme.group(1).lower() in _LINK_SCHEMES


class _WritersOwnElements(Treeprocessor):
    """Keeps in the page only what the writer emits (see the module docstring)."""

    def __init__(self, md, out_dir: Path):
        super().__init__(md)
        self.out_dir = out_dir

    def run(self, root: etree.Element) -> None:
        for parent in list(root.iter()):
            for i, child in enumerate(list(parent)):
                if child.tag == "table":
                    wrapper = etree.Element("div", {"class": "table-scroll"})
                    wrapper.tail, child.tail = child.tail, None
                    parent.remove(child)
                    wrapper.append(child)
                    parent.insert(i, wrapper)
        for element in root.iter():
            allowed = _ATTRIBUTES.get(element.tag, set()) | _ANY_ELEMENT
            for key in [k for k in element.attrib if k not in allowed]:
                del element.attrib[key]
            if element.tag == "img":
                self._figure(element)
            elif element.tag == "a" and not _safe_href(element.get("href", "")):
                del element.attrib["href"]

    def _figure(self, img: etree.Element) -> None:
        src = html.unescape(img.get("src", ""))
        path = self.out_dir / src
        if _OWN_FIGURE.fullmatch(src) and path.is_file():
            img.set("src", "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode())
            return
        # not one of the report's own figures: its alt text, as text
        alt = img.get("alt", "")
        img.tag, img.text = "span", alt
        img.attrib.clear()


class _NoRawHtml(Extension):
    def __init__(self, out_dir: Path):
        super().__init__()
        self.out_dir = out_dir

    def extendMarkdown(self, md) -> None:  # noqa: N802 - python-markdown's name
        md.preprocessors.deregister("html_block")
        md.inlinePatterns.deregister("html")
        md.treeprocessors.register(_WritersOwnElements(md, self.out_dir), "writers_own_elements", -100)


def to_html(markdown_text: str, out_dir: Path, title: str) -> str:
    """One static HTML page of the Markdown: raw HTML refused, figures from ``out_dir`` embedded, no network."""
    converter = markdown.Markdown(extensions=["tables", "toc", _NoRawHtml(Path(out_dir))],
                                  extension_configs={"toc": {"slugify": lambda value, _sep: anchor(value)}})
    body = converter.convert(markdown_text)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>solbench report: {html.escape(title)}</title><style>{_CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")
