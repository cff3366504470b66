"""Spec YAML loading with line numbers: ``load_yaml`` returns the data and the line of every key path.

Floats like 3e-4 stay floats (YAML 1.1 would read a string), duplicate keys are errors and a syntax error
is one line naming the file, line and column (``yaml_error``); ``_dotted``
and ``_nearest_line`` turn a key path into the ``key.path`` and the file line that error messages name.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from solbench.errors import ConfigError


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that reads 1e-4 as a float (YAML 1.1 wants 1.0e-4) and refuses duplicate keys."""


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:float"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                |[-+]?\.(?:inf|Inf|INF)
                |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."),
)


def _index_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int], source: str) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in seen:
                raise ConfigError(f"{source}:{key_node.start_mark.line + 1}: {_dotted(path + (key,))}: duplicate key "
                                  f"(first at line {seen[key]})")
            seen[key] = key_node.start_mark.line + 1
            _index_lines(value_node, path + (key,), lines, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _index_lines(item, path + (index,), lines, source)


def load_yaml(path: str | Path) -> tuple[dict, dict[tuple, int]]:
    """(data, {key path: line}) of a YAML mapping file; ConfigError on syntax errors or duplicates."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read spec {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(non_utf8(path, err)) from None
    try:
        node = yaml.compose(text, Loader=_SpecLoader)
        data = yaml.load(text, Loader=_SpecLoader)
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error(path, err)) from None
    lines: dict[tuple, int] = {}
    if node is not None:
        _index_lines(node, (), lines, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a spec is a YAML mapping (name, base, matrix, ...), got {type(data).__name__}")
    return data, lines


def non_utf8(path: str | Path, err: UnicodeDecodeError) -> str:
    """One line for a spec file that is not UTF-8 text: ``file:line: not UTF-8 text (byte 0x.. at column ..)``."""
    before = err.object[:err.start]
    line = before.count(b"\n") + 1
    column = err.start - (before.rfind(b"\n") + 1) + 1
    return (f"{path}:{line}: not UTF-8 text (byte {err.object[err.start:err.start + 1].hex()} at column {column}); "
            "save the spec as UTF-8")


def yaml_error(path: str | Path, err: yaml.YAMLError) -> str:
    """One line for a YAML syntax error: ``file:line:column: invalid YAML: what`` and, where PyYAML says
    it, what it was reading and where that began (PyYAML's own text spans lines and names
    ``"<unicode string>"`` instead of the file)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or not problem:
        return f"{path}: invalid YAML: {' '.join(str(err).split())}"
    text = f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {problem}"
    context, start = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context:
        began = f" that began at line {start.line + 1}, column {start.column + 1}" if start is not None else ""
        text += f" ({context}{began})"
    return text


def _dotted(path: Sequence) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "<top>"


def _nearest_line(lines: dict[tuple, int], loc: tuple) -> int | None:
    for end in range(len(loc), -1, -1):
        if loc[:end] in lines:
            return lines[loc[:end]]
    return None
