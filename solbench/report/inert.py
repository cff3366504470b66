"""Text the report did not write, made inert: a leaf module (it imports no report module), so that the tables
(solbench.report.tables, which quote a run's error line) and the renderer (solbench.report.render) share one rule.
"""

from __future__ import annotations

import html
import re

from solbench.text.bounded_text import clip

TEXT_CHARS = 4000  # a note's or caption's bound
_NEWLINES = re.compile(r"[\r\n\u2028\u2029\x0b\x0c\x85]+")


def neutral(text, limit: int = TEXT_CHARS) -> str:
    """``text`` made inert in Markdown and HTML: ``& < >`` as entities, newlines as spaces, at most ``limit``
    characters of it (``clip``: the first ones and how many it had). Clipping comes first: the cost is bounded too."""
    return _NEWLINES.sub(" ", html.escape(clip(text, limit), quote=False))
