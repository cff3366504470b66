"""The doctor's report rows: a ``Row`` per thing checked, and the statuses a row can have."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"


@dataclass
class Row:
    """One line of the doctor's report."""

    section: str  # "gpu", "packages", "models", "rewards", "memory", "spec"
    item: str
    status: str  # ok | warn | fail | info
    detail: str
    fix: str = ""  # how to get what is missing (a command), if anything
    gb: float | None = None  # memory rows: the amount itemised, GB (1e9 bytes) per rank
