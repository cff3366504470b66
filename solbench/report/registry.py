"""Report kinds as plugins: what a plugin returns (Table, Figure, Note) and the registry.

A report kind is one function ``(Tables) -> Table | Figure | Note | list of them`` registered with
``@report_kind(name, title=..., order=...)``. Plugins read only the collected tables handed to them
(``solbench.report.tables.Tables``) and never write files: the writer (``solbench.report.build``)
turns their outputs into CSV files, PNG files, a Markdown index and an HTML page. A plugin with
nothing to show (no timings, no candidates, ...) returns a ``Note`` saying so, so the report always
explains an empty section instead of silently dropping it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

import pandas as pd

from solbench.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure as MplFigure

    from solbench.report.tables import Tables

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def _check_name(name: str) -> str:
    # Output names become file names: keep them to a safe, stable alphabet.
    slug = re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_")
    if not slug:
        raise ValueError(f"output name {name!r} has no usable characters")
    return slug


@dataclass
class Table:
    """A table: ``data`` (tidy numbers, written as CSV) and ``display`` (formatted, for Markdown).

    ``display`` defaults to ``data`` with floats rounded to 4 significant decimals.
    """

    name: str
    title: str
    data: pd.DataFrame
    caption: str = ""
    display: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        self.name = _check_name(self.name)


@dataclass
class Figure:
    """A matplotlib figure (written as PNG) and, optionally, the numbers it plots (written as CSV)."""

    name: str
    title: str
    figure: "MplFigure"
    caption: str = ""
    data: pd.DataFrame | None = None
    #: the file name (without .png) render_output saved it under, once saved (names are made unique per report)
    written: str | None = None

    def __post_init__(self) -> None:
        self.name = _check_name(self.name)


@dataclass
class Note:
    """Text shown in place of a table or figure (why a section is empty, a caveat, a definition)."""

    title: str
    text: str
    level: str = "info"  # info | warning


Output = Union[Table, Figure, Note]
PluginResult = Union[Output, list, None]


@dataclass
class ReportKind:
    """One registered plugin."""

    name: str
    title: str
    func: Callable[["Tables"], PluginResult]
    order: int
    description: str = ""
    tags: tuple[str, ...] = field(default_factory=tuple)

    def __call__(self, tables: "Tables") -> list[Output]:
        result = self.func(tables)
        return normalise_outputs(result, self.name)


_REGISTRY: dict[str, ReportKind] = {}


def report_kind(name: str, *, title: str, order: int = 100) -> Callable:
    """Decorator registering ``func(tables)`` as the report kind ``name`` (shown under ``title``).

    Sections appear in increasing ``order``. Registering a name twice is an error (a plugin module
    imported under two names would otherwise silently replace the first).
    """
    if not _NAME_RE.match(name):
        raise ValueError(f"report kind name {name!r} must be lower_snake_case")

    def decorate(func: Callable) -> Callable:
        existing = _REGISTRY.get(name)
        if existing is not None and existing.func is not func:
            if (existing.func.__module__, existing.func.__qualname__) != (func.__module__, func.__qualname__):
                raise ValueError(f"report kind {name!r} is already registered by {existing.func.__module__}")
        doc = (func.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = ReportKind(name, title, func, order, doc[0] if doc else "")
        return func

    return decorate


def kinds() -> list[ReportKind]:
    """Every registered report kind, in section order."""
    return sorted(_REGISTRY.values(), key=lambda k: (k.order, k.name))


def get_kind(name: str) -> ReportKind:
    """The report kind called ``name``; an unknown name fails with the closest matches."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    import difflib

    close = difflib.get_close_matches(name, list(_REGISTRY), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ConfigError(f"unknown report kind {name!r}{hint} (known: {', '.join(sorted(_REGISTRY))})")


def normalise_outputs(result: Any, plugin: str) -> list[Output]:
    """Flatten a plugin's return value into a list of outputs, rejecting anything else."""
    if result is None:
        return []
    items = result if isinstance(result, (list, tuple)) else [result]
    flat: list[Output] = []
    for item in items:
        if isinstance(item, (list, tuple)):
            flat.extend(normalise_outputs(item, plugin))
        elif isinstance(item, (Table, Figure, Note)):
            flat.append(item)
        else:
            raise TypeError(f"report kind {plugin!r} returned a {type(item).__name__}; "
                            "expected Table, Figure, Note or a list of them")
    return flat
