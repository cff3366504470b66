"""A provenance table (experiments/provenance/<spec name>.yaml): its rows, read and validated.

``load_table`` raises a ConfigError naming the file, line and key of a bad row: an unknown setting, a ref
that is not one of ``references``, a method the spec does not run, a deviation without both its value and
its one-line reason (or one whose value is the reference's), a (setting, method) with two rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.errors import ConfigError
from solbench.provenance.settings import NORMALISE, SETTINGS, same

TABLE_FOLDER = "provenance"  # experiments/provenance/<spec name>.yaml
ROW_KEYS = {"setting", "methods", "value", "ref", "file", "at", "solbench", "deviation", "note"}


@dataclass
class Row:
    setting: str
    methods: list[str]
    value: Any
    ref: str
    file: str
    at: str
    line: int  # in the table file
    deviation: str | None = None
    solbench: Any = None
    note: str = ""

    @property
    def expected(self) -> Any:
        """What the spec must resolve to: the reference's value, or solbench's for a deviation."""
        return self.solbench if self.deviation else self.value


@dataclass
class Table:
    path: Path
    spec: str
    references: dict[str, dict[str, str]]
    rows: list[Row] = field(default_factory=list)

    def deviations(self) -> list[Row]:
        return [r for r in self.rows if r.deviation]

    def deviation_bullets(self) -> list[str]:
        """One line per distinct reason: "- <reason>: <setting> [<methods>], ..." (header and report)."""
        groups: dict[str, dict[str, list[str]]] = {}
        for row in self.deviations():
            settings = groups.setdefault(row.deviation.strip(), {})
            settings.setdefault(row.setting, [])
            settings[row.setting] += [m for m in row.methods if m not in settings[row.setting]]
        return [f"- {reason}: " + ", ".join(f"{setting} [{', '.join(methods)}]" for setting, methods in settings.items())
                for reason, settings in groups.items()]


def table_path(spec_path: str | Path, spec_name: str) -> Path:
    return Path(spec_path).parent / TABLE_FOLDER / f"{spec_name}.yaml"


def _is_run_path(setting: str) -> bool:
    from solbench.spec import _is_run_path as is_run_path

    return is_run_path(setting)


def find_table(experiment: str) -> Path | None:
    """The provenance table of an experiment by name (experiments/provenance/<name>.yaml under the working
    directory or the solbench checkout), or None: the reports' way to find it without the spec."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        path = root / "experiments" / TABLE_FOLDER / f"{experiment}.yaml"
        if path.is_file():
            return path
    return None


def load_table(path: str | Path, methods: list[str] | None) -> Table:
    """Read and validate a provenance table; ConfigError naming the file, line and key of a bad row.

    ``methods``: the spec's methods ("all" expands to them, others are errors); None keeps "all" as is
    and checks no method names (a report without its spec)."""
    from solbench.spec import load_yaml

    path = Path(path)
    data, lines = load_yaml(path)

    def fail(loc: tuple, message: str) -> ConfigError:
        return ConfigError(f"{path}:{lines.get(loc, lines.get(loc[:2], '?'))}: {message}")

    unknown = set(data) - {"spec", "references", "rows"}
    if unknown or not isinstance(data.get("rows"), list) or not isinstance(data.get("references"), dict):
        raise fail((), f"a provenance table has spec, references and rows (got {sorted(data)})")
    references = data["references"]
    table = Table(path=path, spec=str(data.get("spec")), references=references)
    seen: dict[tuple[str, str], int] = {}
    for index, raw in enumerate(data["rows"]):
        loc = ("rows", index)
        line = lines.get(loc, 0)
        if not isinstance(raw, dict) or set(raw) - ROW_KEYS or not {"setting", "value", "ref", "file", "at"} <= set(raw):
            raise fail(loc, f"rows[{index}]: a row has setting, value, ref, file, at (+ methods, solbench and "
                            f"deviation, note); got {sorted(raw) if isinstance(raw, dict) else raw!r}")
        setting = raw["setting"]
        if setting not in SETTINGS and not setting.startswith("method_config.") and not _is_run_path(setting):
            raise fail(loc, f"rows[{index}]: unknown setting {setting!r} (a dotted RunConfig path or one of "
                            f"{', '.join(sorted(SETTINGS))})")
        every = raw.get("methods", "all") == "all"
        row_methods = (["all"] if methods is None else methods) if every else list(raw["methods"])
        stray = [m for m in row_methods if methods is not None and m not in methods]
        if stray:
            raise fail(loc, f"rows[{index}] ({setting}): methods {stray} are not in the spec ({', '.join(methods)})")
        if raw["ref"] not in references:
            raise fail(loc, f"rows[{index}] ({setting}): ref {raw['ref']!r} is not one of references "
                            f"({', '.join(references)})")
        if ("deviation" in raw) != ("solbench" in raw):
            raise fail(loc, f"rows[{index}] ({setting}): a deviation needs both solbench (the spec's value) and "
                            "deviation (its one-line reason)")
        if "deviation" in raw:
            reason = raw["deviation"]
            if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
                raise fail(loc, f"rows[{index}] ({setting}): deviation must be a one-line reason")
            norm = NORMALISE.get(setting, lambda v: v)
            if same(norm(raw["solbench"]), norm(raw["value"])):
                raise fail(loc, f"rows[{index}] ({setting}): solbench equals the reference's value: not a deviation")
        for method in row_methods:
            if (setting, method) in seen:
                raise fail(loc, f"rows[{index}]: {setting} of {method} already has a row (line {seen[setting, method]})")
            seen[setting, method] = line
        table.rows.append(Row(setting=setting, methods=row_methods, value=raw["value"], ref=raw["ref"],
                              file=str(raw["file"]), at=str(raw["at"]), line=line, deviation=raw.get("deviation"),
                              solbench=raw.get("solbench"), note=str(raw.get("note", ""))))
    return table

