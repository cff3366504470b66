"""What is known about a spec file's text without the spec code: the name pattern experiments are held to and
the one line for a file that is not UTF-8 text.

A leaf module (it imports nothing of solbench), so that the report, which reads a spec's ``report:`` mapping as
plain YAML data and must not import solbench.spec, shares them with the spec loader instead of a copy.
"""

from __future__ import annotations

from pathlib import Path

#: Experiment, profile and run names: the report folder reports/<name> and the results folder results/<name>
#: must stay inside their roots.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


def non_utf8(path: str | Path, err: UnicodeDecodeError) -> str:
    """One line for a spec file that is not UTF-8 text: ``file:line: not UTF-8 text (byte 0x.. at column ..)``."""
    before = err.object[:err.start]
    line = before.count(b"\n") + 1
    column = err.start - (before.rfind(b"\n") + 1) + 1
    return (f"{path}:{line}: not UTF-8 text (byte {err.object[err.start:err.start + 1].hex()} at column {column}); "
            "save the spec as UTF-8")
