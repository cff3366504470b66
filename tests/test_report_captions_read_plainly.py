"""Captions a reader can read (issue 52, item 9): no range whose two ends print as one number, and the jargon the
pages use decoded in the report's glossary."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from solbench.report import ReportOptions, clock
from solbench.report.glossary import TERMS, glossary_page, link_terms
from solbench.report.render import anchor


def _describe(monkeypatch, shares):
    projection = pd.DataFrame({"run_id": [f"r{i}" for i in range(len(shares))], "precision": "explore",
                               "quantized_share": shares})
    monkeypatch.setattr(clock, "phase_projection", lambda tables: projection)
    monkeypatch.setattr(clock, "_projection", lambda tables: (projection, []), raising=False)
    monkeypatch.setattr(clock, "counted_phases", lambda tables: (["explore", "train"], []))
    return clock.describe(SimpleNamespace(options=ReportOptions()))


def test_a_share_range_is_written_only_where_its_ends_differ_in_print(monkeypatch):
    """Catches "the 95%-95% of a forward's FLOPs" (tiny_paper's projected-clock captions): two runs' shares of 0.951
    and 0.953 differ by more than the old 5e-4 test but print as the same percentage."""
    text = _describe(monkeypatch, [0.951, 0.953])
    assert "95%-95%" not in text and "only the 95% of a forward's FLOPs" in text
    assert "only the 45%-95% of" in _describe(monkeypatch, [0.45, 0.95])


def test_the_glossary_decodes_the_jargon_the_issue_names():
    """Catches jargon nowhere decoded (mde, crossed design, Satterthwaite, x0_rel_dist, dose, φ, †, "units"), and a
    glossary heading whose anchor the links do not reach."""
    page = glossary_page("x")
    for word in ("mde", "crossed design", "Satterthwaite", "x0_rel_dist", "dose", "φ", "†", "units", "recipe",
                 "backend", "projection", "verdict rule", "interval kinds"):
        term = next(t for t in TERMS if t.name == word or word in t.name)
        assert f"## {term.anchor.replace('-', ' ')}" in page and f"**{term.name}**" in page, word
        # the id the HTML page gives that heading (render.anchor, python-markdown's toc) is the one the links use
        assert anchor(term.anchor.replace("-", " ")) == term.anchor, word
    linked = link_terms("a dagger † and φ and the x0_rel_dist of the dose")
    for name in ("dagger", "phi", "x0-rel-dist", "dose"):
        assert f"(glossary.md#{name})" in linked, name
