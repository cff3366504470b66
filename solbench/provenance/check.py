"""A real spec against its provenance table: every problem, and the spec-header block of its deviations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from solbench.provenance.settings import NORMALISE, PROTOCOL, resolve, run_settings, same
from solbench.provenance.table import Row, Table, load_table, table_path


def _header_text(spec_path: Path) -> str:
    """The spec's leading comment block, without the '#' marks, whitespace-normalised."""
    text = []
    for line in Path(spec_path).read_text().splitlines():
        if not line.startswith("#"):
            break
        text.append(line[1:].strip())
    return " ".join(" ".join(text).split())


class Resolved:
    """Each run's settings and their values, computed once (a check reads them for every row)."""

    def __init__(self, spec) -> None:
        self.runs = [run.config for run in spec.runs]
        self.methods = list(dict.fromkeys(cfg.method for cfg in self.runs))
        self._values: dict[tuple[int, str], Any] = {}
        self.settings = {method: list(dict.fromkeys(s for cfg in self.runs if cfg.method == method
                                                    for s in run_settings(cfg)))
                         for method in self.methods}

    def value(self, index: int, setting: str) -> Any:
        """The value of ``setting`` in run ``index``; KeyError / AttributeError where the run has no such path."""
        key = (index, setting)
        if key not in self._values:
            try:
                self._values[key] = resolve(self.runs[index], setting)
            except (KeyError, AttributeError) as err:
                self._values[key] = err
        if isinstance(self._values[key], Exception):
            raise self._values[key]
        return self._values[key]


def protocol_problems(spec_path: str | Path, resolved: Resolved) -> list[str]:
    """The evaluation protocol's settings that differ between the methods of one spec (one model)."""
    problems = []
    for setting in PROTOCOL:
        by_value: dict[str, list[str]] = {}
        for index, cfg in enumerate(resolved.runs):
            key = repr(resolved.value(index, setting))
            by_value.setdefault(key, [])
            if cfg.method not in by_value[key]:
                by_value[key].append(cfg.method)
        if len(by_value) > 1:
            problems.append(f"{spec_path}: the evaluation protocol differs between methods: {setting} is "
                            + "; ".join(f"{value} for {', '.join(methods)}" for value, methods in by_value.items()))
    seeds = {m: sorted({cfg.seed for cfg in resolved.runs if cfg.method == m}) for m in resolved.methods}
    if len({tuple(s) for s in seeds.values()}) > 1:
        problems.append(f"{spec_path}: the evaluation protocol differs between methods: the run seeds, which draw "
                        f"the eval noise, are {seeds}")
    return problems


def table_problems(spec_path: str | Path, table: Table, resolved: Resolved) -> list[str]:
    """Every problem of a spec's runs against ``table``: a setting some method's runs have and no row holds
    (by enumeration, solbench.provenance.settings.run_settings), a row whose value the runs do not resolve
    to, a deviation the spec's header does not list, an evaluation protocol that differs between methods."""
    path = table.path
    problems = []
    by_method: dict[str, dict[str, Row]] = {m: {} for m in resolved.methods}
    for row in table.rows:
        for method in row.methods:
            by_method[method][row.setting] = row
    for method in resolved.methods:
        missing = [s for s in resolved.settings[method] if s not in by_method[method]]
        if missing:
            problems.append(f"{path}: {method} has no row for {', '.join(missing)}")
    for index, cfg in enumerate(resolved.runs):
        for setting, row in by_method[cfg.method].items():
            try:
                actual = resolved.value(index, setting)
            except (KeyError, AttributeError):
                problems.append(f"{path}:{row.line}: {setting} does not exist in {cfg.method}'s runs")
                continue
            norm = NORMALISE.get(setting, lambda v: v)
            if not same(norm(actual), norm(row.expected)):
                kind = f"the deviation's solbench value {row.solbench!r}" if row.deviation else \
                    f"the reference's {row.value!r} ({row.ref} {row.file}: {row.at})"
                problems.append(f"{path}:{row.line}: {setting} of {cfg.method} (run {cfg.run_id}) resolves to "
                                f"{actual!r}, not {kind}")
    header = _header_text(spec_path)
    for bullet in table.deviation_bullets():
        if " ".join(bullet.split()) not in header:
            problems.append(f"{spec_path}: its header does not list the deviation {bullet!r} of {path} "
                            f"(python -m solbench.provenance header {spec_path} prints the block)")
    problems += protocol_problems(spec_path, resolved)
    return list(dict.fromkeys(problems))


def check(spec_path: str | Path) -> list[str]:
    """Every problem of a real spec against its provenance table (empty: the two agree)."""
    from solbench.spec import load_spec

    spec = load_spec(spec_path)
    path = table_path(spec_path, spec.name)
    if not path.is_file():
        return [f"{spec_path}: no provenance table at {path}"]
    resolved = Resolved(spec)
    return table_problems(spec_path, load_table(path, resolved.methods), resolved)


def header_block(spec_path: str | Path) -> str:
    """The spec-header comment lines listing every deviation of its provenance table."""
    from solbench.spec import load_spec

    spec = load_spec(spec_path)
    path = table_path(spec_path, spec.name)
    table = load_table(path, list(dict.fromkeys(run.method for run in spec.runs)))
    lines = [f"# Deviations from the references ({path.as_posix()}, checked by tests/test_provenance.py):"]
    for bullet in table.deviation_bullets():
        words, line = bullet.split(), "#"
        for word in words:
            if len(line) + 1 + len(word) > 110 and line != "#":
                lines.append(line)
                line = "#  "
            line += " " + word
        lines.append(line)
    return "\n".join(lines)
