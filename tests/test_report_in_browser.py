"""A report's HTML pages in a real browser (issue 52): headless Chromium (Debian's `chromium`, which .ci/run
installs) opens each page from its file:// URL in a 1400 px window; every image loads, nothing makes the page
wider than the window, every anchor the page links to exists, and a screenshot of its first screen is kept
(under the test's tmp path; also under $SOLBENCH_SCREENSHOTS when that names a folder). The browser is driven over
the DevTools protocol on a pipe with the stdlib alone (tests/_chromium.py). Without a browser the tests skip,
saying so."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from _chromium import Chromium, find_browser

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted(p.parent for p in (ROOT / "reports").glob("*/index.html"))
WIDTH = 1400

#: What the page looks like to a reader: the images and whether each loaded, the page's and the window's
#: widths, what sticks out past the window (outside the tables' own scrolling blocks), the anchors it links to
#: that it lacks, and the relative links it has (checked against the folder in Python).
MEASURE = """(async () => {
  await Promise.all([...document.images].map(i => i.decode().catch(() => null)));
  const width = document.documentElement.clientWidth;
  const outside = [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > width + 0.5)
    .filter(e => !e.closest('.table-scroll') || e.closest('.table-scroll').getBoundingClientRect().right > width + 0.5)
    .slice(0, 5).map(e => e.tagName + ': ' + (e.textContent || '').slice(0, 80));
  const hrefs = [...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'));
  return {
    images: [...document.images].map(i => ({alt: i.alt, natural: i.naturalWidth,
                                             shown: i.getBoundingClientRect().width})),
    scrollWidth: document.documentElement.scrollWidth, clientWidth: width, outside,
    missingAnchors: hrefs.filter(h => h.startsWith('#') && !document.getElementById(decodeURIComponent(h.slice(1)))),
    relative: hrefs.filter(h => !h.startsWith('#') && !/^[a-z][a-z0-9+.-]*:/i.test(h)),
    scrolling: [...document.querySelectorAll('.table-scroll')].filter(d => d.scrollWidth > d.clientWidth).length,
  };
})()"""


@pytest.fixture(scope="module")
def browser():
    binary = find_browser()
    if binary is None:
        pytest.skip("no Chromium here ($SOLBENCH_CHROMIUM unset, no /usr/bin/chromium): `apt-get install chromium` "
                    "(as .ci/run does) to open the report's pages in a browser")
    with Chromium(binary, width=WIDTH, height=1000) as chromium:
        yield chromium


def look(browser: Chromium, page: Path, shots: Path) -> dict:
    """Open ``page``, keep a screenshot of its first screen in ``shots`` (and $SOLBENCH_SCREENSHOTS), measure it."""
    tab = browser.open(page.resolve().as_uri())
    seen = tab.evaluate(MEASURE)
    shots.mkdir(parents=True, exist_ok=True)
    shot = tab.screenshot(shots / f"{page.parent.name}_{page.stem}.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    extra = os.environ.get("SOLBENCH_SCREENSHOTS")
    if extra:
        Path(extra).mkdir(parents=True, exist_ok=True)
        tab.screenshot(Path(extra) / shot.name)
    return seen


def assert_readable(page: Path, seen: dict) -> None:
    broken = [image["alt"] for image in seen["images"] if not image["natural"] > 0]
    assert not broken, f"{page}: images that did not load: {broken}"
    assert seen["scrollWidth"] <= seen["clientWidth"], (
        f"{page}: the page is {seen['scrollWidth']} px wide in a {seen['clientWidth']} px window: {seen['outside']}")
    assert all(image["shown"] <= seen["clientWidth"] for image in seen["images"]), page
    assert not seen["missingAnchors"], f"{page}: links to anchors it lacks: {seen['missingAnchors']}"
    lacking = [h for h in seen["relative"] if not (page.parent / unquote(urlsplit(h).path)).is_file()]
    assert not lacking, f"{page}: links to files the report folder lacks: {lacking}"


@pytest.fixture(scope="module")
def written_report(tmp_path_factory):
    from fixtures.synthetic_results import build_main
    from solbench.report import ReportOptions, write_report

    root = tmp_path_factory.mktemp("browser")
    build_main(root / "results")
    return write_report("fx_main", root / "results", root / "reports", options=ReportOptions(n_boot=100),
                        strict=True).parent


def test_a_written_reports_pages_show_every_figure_within_the_window(browser, written_report, tmp_path):
    """Bugs caught: a figure that did not load (a src the page cannot reach, a broken embed), a table wider than
    the window giving the whole page a horizontal scroll bar (the Findings table at 1400 px), a contents link to a
    heading id the converter spells differently, a link to a CSV the writer did not write."""
    pages = sorted(written_report.glob("*.html"))
    assert written_report / "index.html" in pages
    shown = 0
    for page in pages:
        seen = look(browser, page, tmp_path)
        assert_readable(page, seen)
        shown += len(seen["images"])
    assert shown == len(list(written_report.glob("*.png")))  # every figure is on a page, and loads
    assert (tmp_path / "fx_main_index.png").is_file()


def test_a_wide_table_scrolls_in_its_own_block_and_the_page_never_does(browser, tmp_path):
    """Bug caught: the page's CSS let a 40-column table, a 3000 px figure and an unbroken 600-character token widen
    the page itself; the table must scroll inside its own block, the figure shrink to the page, the token wrap."""
    from PIL import Image

    from solbench.report.render import to_html

    Image.new("RGB", (3000, 200), (40, 90, 200)).save(tmp_path / "wide.png")
    token = ",".join(f"{i:012x}" for i in range(46))  # run ids joined without a space
    header = "| " + " | ".join(f"column {i} of a very wide table" for i in range(40)) + " |"
    rule = "|" + "---|" * 40
    row = "| " + " | ".join(f"cell_{i}_with_a_long_unbreakable_value_{token[:40]}" for i in range(40)) + " |"
    markdown = (f"# A wide page\n\n{token}\n\n> **Warning.** runs {token}\n\n### {token[:300]}\n\n`{token}`\n\n"
                f"{header}\n{rule}\n{row}\n\n![A wide figure](wide.png)\n")
    page = tmp_path / "wide.html"
    page.write_text(to_html(markdown, tmp_path, "wide"))
    seen = look(browser, page, tmp_path / "shots")
    assert_readable(page, seen)
    assert seen["scrolling"] == 1  # the table is wider than the page and scrolls in its block
    (figure,) = seen["images"]
    assert figure["natural"] == 3000 and figure["shown"] < seen["clientWidth"]


@pytest.mark.parametrize("folder", COMMITTED, ids=[p.name for p in COMMITTED])
def test_the_committed_reports_pages_show_every_figure_within_the_window(browser, folder, tmp_path):
    """Bug caught: the committed report (what a user opens before running anything) had its Findings table run
    past a 1400 px window, a horizontal scroll bar on the first screen."""
    for page in sorted(folder.glob("*.html")):
        assert_readable(page, look(browser, page, tmp_path))
