"""A report's pages run nothing they were given (issue 52): every string the report quotes from results, specs or
prompt files reaches its Markdown neutralised and its HTML as text.

The pipeline is the real one from the spec on: `solbench run` of a spec naming two prompt files (a .txt whose line is
a script, a .jsonl whose skills are an <img onerror>, a pipe and a megabyte), through the launcher and run folders,
with a run function (below) writing what the trainer writes, one run failing the way a run scoring shapes fails on
that line; one run's status.json then replaced as a run received from someone else's machine could be; then
`solbench collect` and `solbench report`. Every page of the report is parsed with the stdlib's html.parser.
"""

from __future__ import annotations

import base64
import json
import re
import textwrap
from html.parser import HTMLParser
from pathlib import Path

import pytest

from solbench.cli import main as cli
from solbench.results import RunStore
from solbench.spec import load_spec

SCRIPT_LINE = "<script>alert(1)</script> a red circle"  # a prompt file's line
IMG_SKILL = "<img src=x onerror=alert(4)>"  # a .jsonl prompt's skill
RECEIVED_ERROR = "<script>alert(7)</script>"  # a received run's status.json error
PIPE_SKILL = "left|right"  # a skill (so a metric name and a table header) with a pipe
PIPE_PROMPTS = "odd|name.txt"  # a prompt file whose name (so an arm label) has a pipe
MEGABYTE = "m" * 1_000_000  # a skill a megabyte long

SPEC = """
name: hostile
launch: local
base:
  model: {name: tiny}
  rewards: {colorfulness: 1.0}
  prompts_per_iter: 2
  iterations: 2
  eval: {every: 1, prompts: PROMPTS/eval.jsonl, n_prompts: 4, seeds_per_prompt: 1, rewards: [colorfulness]}
matrix:
  method: [diffusion_nft]
  train_prompts: [PROMPTS/train.txt, "PROMPTS/odd|name.txt"]
  seed: [0, 1, 2]
  group_size: [2]
"""


def hostile_run(cfg, store: RunStore, progress=None) -> dict:
    """What the trainer writes for a run (train rewards, eval rewards overall and per prompt skill, timings), from
    the spec's own prompt files; the run of train.txt at seed 1 fails as a run scoring shapes does on its line."""
    from solbench.world.grammar import parse_prompt
    from solbench.world.prompts import load_prompt_set

    train = load_prompt_set(cfg.train_prompts)
    skills = list(dict.fromkeys(r.skill for r in load_prompt_set(cfg.eval.prompts)))
    if cfg.seed == 1 and Path(cfg.train_prompts).name == "train.txt":
        for record in train:
            parse_prompt(record.text)  # PromptParseError quoting the script line
    bump = 0.01 * cfg.seed + (0.02 if "odd" in str(cfg.train_prompts) else 0.0)
    for step in range(cfg.iterations + 1):
        wall = 2.0 * step
        rows = [{"step": step, "split": "eval", "metric": "colorfulness", "value": 0.2 + 0.01 * step + bump,
                 "images_seen": 4 * step, "wall_s": wall}]
        rows += [{"step": step, "split": "eval", "metric": f"colorfulness/{skill}", "images_seen": 4 * step,
                  "value": 0.1 + 0.05 * i + 0.01 * step + bump, "wall_s": wall} for i, skill in enumerate(skills)]
        if step:
            rows.append({"step": step, "split": "train", "metric": "reward", "value": 0.3 + 0.02 * step + bump,
                         "images_seen": 4 * step, "wall_s": wall})
            store.append("timings", [{"step": step, "phase": phase, "precision": "full", "seconds": 1.0,
                                      "n_images": 4, "flops": None} for phase in ("rollout", "train")])
        store.append("metrics", rows)
    return {"steps": cfg.iterations}


class _Page(HTMLParser):
    """What a browser would make live of a page: its tags and attributes, its images and its visible text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text())
    page.close()
    return page


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report folder of the hostile results (see the module docstring) and the run folders' root."""
    root = tmp_path_factory.mktemp("hostile")
    prompts = root / "prompts"
    prompts.mkdir()
    (prompts / "train.txt").write_text(f"a red square\n{SCRIPT_LINE}\n")
    (prompts / PIPE_PROMPTS).write_text("a blue circle\na green triangle\n")
    records = [("e0", "a blue circle", IMG_SKILL), ("e1", "a red square", PIPE_SKILL),
               ("e2", "a green triangle", MEGABYTE), ("e3", "a yellow square", "single_object")]
    (prompts / "eval.jsonl").write_text("".join(json.dumps({"id": i, "text": t, "skill": s}) + "\n"
                                                for i, t, s in records))
    spec = root / "hostile.yaml"
    spec.write_text(textwrap.dedent(SPEC).replace("PROMPTS", str(prompts)))
    results, reports = ["--results", str(root / "results")], ["--reports", str(root / "reports")]
    assert cli(["run", str(spec), *results, *reports, "--run-fn", "test_report_html_escaping:hostile_run",
                "--quiet", "--no-report"]) == 1  # the run that fails on the script line did not finish
    runs = {(Path(r.config.train_prompts).name, r.config.seed): r.run_id for r in load_spec(spec).runs}
    received = RunStore(root / "results" / "hostile" / runs[("train.txt", 2)], runs[("train.txt", 2)])
    status = json.loads((received.run_dir / "status.json").read_text())
    (received.run_dir / "status.json").write_text(json.dumps({**status, "state": "failed", "error": RECEIVED_ERROR}))
    assert cli(["collect", str(spec), *results]) == 0
    assert cli(["report", str(spec), *results, *reports]) == 0
    folder = root / "reports" / "hostile"
    assert (folder / "index.html").is_file()
    return folder


def pages(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.html"))


def visible_text(folder: Path) -> str:
    return "\n".join("".join(parse(p).text) for p in pages(folder))


def test_no_page_has_a_script_or_an_event_handler(report):
    """Bug caught: python-markdown kept raw HTML and the report did not escape what it quoted, so a prompt line's
    <script>, a skill's <img onerror> and a received run's status.json error were live tags in index.html."""
    for path in pages(report):
        page = parse(path)
        tags = [tag for tag, _ in page.tags]
        assert "script" not in tags and "iframe" not in tags and "object" not in tags, path
        handlers = [(tag, key) for tag, attrs in page.tags for key in attrs if key.lower().startswith("on")]
        assert not handlers, (path, handlers)
        assert not [attrs for tag, attrs in page.tags if tag == "a" and
                    re.match(r"\s*(javascript|data|vbscript):", attrs.get("href") or "", re.I)], path


def test_the_only_images_are_the_writers_own_figures(report):
    """Bug caught: a skill `<img src=x onerror=...>` became an <img> of the page (loading a foreign src);
    the page's only images must be the report's own PNG files, embedded."""
    own = {path.read_bytes() for path in report.glob("*.png")}
    assert own, "the report wrote no figure"
    shown = 0
    for path in pages(report):
        for tag, attrs in parse(path).tags:
            if tag != "img":
                continue
            src = attrs.get("src") or ""
            assert src.startswith("data:image/png;base64,"), (path, src[:80])
            assert base64.b64decode(src.split(",", 1)[1]) in own, path
            shown += 1
    assert shown >= 1  # the writer's own figures still show


def test_what_was_quoted_is_still_shown_as_text(report):
    """Bug caught: escaping that drops what it escapes (or a page that loses the warning) would hide why a run
    failed: the script line, the received error and the skill must be readable text on the pages."""
    text = visible_text(report)
    assert SCRIPT_LINE in text  # in the failed run's error: PromptParseError quoting the line
    assert "is not in the shapes grammar. Accepted forms: 'a <colour> <shape>'" in text
    assert RECEIVED_ERROR in text
    assert IMG_SKILL in text
    index = "".join(parse(report / "index.html").text)
    assert "not done" in index or "failed" in index  # the index still says runs failed


def test_a_pipe_in_a_skill_or_an_arm_cannot_break_a_table(report):
    """Bug caught: a `|` in a metric name or an arm label (from a prompt file's name) ended its cell, so the row
    had one cell too many and every later column moved; each row must have its header's cells, pipe kept."""
    cells = set()
    for path in pages(report):
        for table in parse(path).tables:
            widths = {len(row) for row in table if row}
            assert len(widths) <= 1, (path, table[:3])
            cells |= {c.strip() for row in table for c in row}
    assert any(PIPE_SKILL in c for c in cells), "the per-skill table lost the skill with a pipe"
    assert any(PIPE_PROMPTS in c for c in cells), "no table names the arm of odd|name.txt"
    for path in report.glob("*.md"):
        for line in path.read_text().splitlines():
            assert not (line.startswith("|") and re.search(r"(?<!\\)\|[^|]*left\|right", line)), (path, line[:200])


def test_a_megabyte_string_costs_a_bounded_cell(report):
    """Bug caught: a 1 MB skill went whole into the per-skill table header of every page (and its HTML twin):
    a string from outside is clipped to a few hundred characters, saying how long it was."""
    for path in [*pages(report), *report.glob("*.md")]:
        longest = max((len(m) for m in re.findall("m{1000,}", path.read_text())), default=0)
        assert longest < 5000, (path, longest)
    assert "(1,000,000 characters)" in visible_text(report)


def test_markdown_pages_hold_no_raw_html_from_outside(report):
    """Bug caught: index.md carried the quoted tags raw, live in any viewer that renders Markdown's HTML; they are
    written as entities (&lt;script&gt;), never as markup."""
    for path in report.glob("*.md"):
        text = path.read_text()
        for tag in ("<script", "<img", "</script"):
            assert tag not in text.lower(), (path, tag)
    assert "&lt;script&gt;alert(7)&lt;/script&gt;" in "".join(p.read_text() for p in report.glob("*.md"))


# -- the converter alone: raw HTML in the Markdown is refused, whoever wrote it ---------------------------

def test_the_converter_refuses_raw_html_and_keeps_the_writers_markup(tmp_path):
    """Bug caught: md.markdown() passed block and inline HTML through, and links to javascript: or images of any
    src were kept; what the writer emits (headings, tables, its own figures, anchors, CSV links) must still work."""
    from PIL import Image

    from solbench.report.render import to_html

    Image.new("RGB", (4, 4), (255, 0, 0)).save(tmp_path / "chart.png")
    markdown = textwrap.dedent("""\
        ## 1. Section

        <div onclick="alert(2)">block</div>

        text <b onmouseover="alert(3)">inline</b> [run](javascript:alert(5)) [hex](java&#115;cript:alert(6))
        [ok](#1-section) [numbers](chart.csv) ![foreign](http://example.com/x.png) ![up](../chart.png)

        ![Chart](chart.png)

        | a | b |
        |---|---|
        | <script>alert(8)</script> | x\\|y |
        """)
    page = _Page()
    page.feed(to_html(markdown, tmp_path, "t<i>"))
    tags = [tag for tag, _ in page.tags]
    assert "script" not in tags and "b" not in tags
    assert all(attrs.get("class") == "table-scroll" for tag, attrs in page.tags if tag == "div")
    assert not [k for _, attrs in page.tags for k in attrs if k.startswith("on")]
    hrefs = [attrs.get("href") for tag, attrs in page.tags if tag == "a"]
    assert hrefs == [None, None, "#1-section", "chart.csv"]
    ids = [attrs.get("id") for tag, attrs in page.tags if tag == "h2"]
    assert ids == ["1-section"]
    images = [attrs["src"] for tag, attrs in page.tags if tag == "img"]
    assert len(images) == 1 and base64.b64decode(images[0].split(",", 1)[1]) == (tmp_path / "chart.png").read_bytes()
    text = "".join(page.text)
    assert '<div onclick="alert(2)">block</div>' in text and "<script>alert(8)</script>" in text
    assert "foreign" in text and "up" in text  # a foreign image shows as its alt text
    assert page.tables == [[["a", "b"], ["<script>alert(8)</script>", "x|y"]]]


def test_a_cell_is_neutralised_and_bounded():
    """Bug caught: cells went into the pipe table as they came: '<' live, a newline ending the row, a 10 MB string
    whole, and a backslash before a pipe turning its escape into a cell break."""
    import pandas as pd

    from solbench.report.render import cell, markdown_table

    assert cell("<b>&</b>") == "&lt;b&gt;&amp;&lt;/b&gt;"
    assert cell("a\nb\r\nc") == "a b c"
    assert cell("x|y") == "x\\|y" and cell("x\\|y") == "x\\\\\\|y"
    long = cell("z" * 10_000_000)
    assert len(long) < 500 and long.endswith("(10,000,000 characters)")
    table = markdown_table(pd.DataFrame({"a|<b>": ["1\\|2"], "c": [float("nan")]}))
    assert table.splitlines() == ["| a\\|&lt;b&gt; | c |", "|---|---|", "| 1\\\\\\|2 | - |"]
