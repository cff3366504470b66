"""Spec YAML loading with line numbers: ``load_yaml`` returns the data and the line of every key path.

Floats like 3e-4 stay floats (YAML 1.1 would read a string), duplicate keys are errors and a syntax error
is one line naming the file, line and column (``yaml_error``); ``_dotted``
and ``_nearest_line`` turn a key path into the ``key.path`` and the file line that error messages name.

A spec comes from anyone, so reading one is bounded before it can take the machine, each bound one line naming
it and the line it was crossed at: the file's size (``MAX_SPEC_BYTES``, checked before it is read: PyYAML reads
about 50 KiB a second), its nodes with every alias expanded (``MAX_SPEC_NODES``, counted by ``_SpecLoader`` as
the nodes are built, so a "billion laughs" file of nine levels of ten aliases is refused once its count passes
the bound, not after building its billion) and its nesting (``MAX_SPEC_DEPTH``, before Python's recursion limit).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from solbench.text.bounded_text import decode_text, read_at_most
from solbench.errors import ConfigError


#: Bytes a spec (or launch profile, provenance table) file may have: the largest shipped one has 43 KiB.
MAX_SPEC_BYTES = 128 * 1024
#: YAML nodes a spec may hold with every alias expanded (what the schema, the checks and the line index walk);
#: the largest shipped one (a provenance table) has about 2,900.
MAX_SPEC_NODES = 100_000
#: Levels a spec may nest mappings and lists (the shipped ones nest 6 at most).
MAX_SPEC_DEPTH = 64


class _BoundCrossed(Exception):
    """A bound of ``_SpecLoader`` crossed at ``mark`` (turned into a ConfigError naming the file by load_yaml)."""

    def __init__(self, mark, message: str):
        super().__init__(message)
        self.mark, self.message = mark, message


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that reads 1e-4 as a float (YAML 1.1 wants 1.0e-4) and refuses duplicate keys, and counts the
    nodes of the document as it builds them with every alias expanded (an alias costs the nodes of what it
    names): past MAX_SPEC_NODES, nested past MAX_SPEC_DEPTH or an alias inside what it names is refused where
    it is met (``_BoundCrossed``)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._expanded = 0  # nodes composed so far, every alias counted as the nodes it names
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its nodes with aliases expanded, once composed

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            anchor = self.peek_event().anchor
            node = super().compose_node(parent, index)
            size = self._sizes.get(id(node))
            if size is None:  # its anchor's node is still being composed: the alias is inside it
                raise _BoundCrossed(mark, f"alias *{anchor} is inside the node &{anchor} names (a recursive "
                                          "alias): it expands without end")
            self._count(size, mark)
            return node
        self._depth += 1
        if self._depth > MAX_SPEC_DEPTH:
            raise _BoundCrossed(mark, f"nested more than {MAX_SPEC_DEPTH} levels deep (the bound on a spec's "
                                      "nesting; the shipped specs nest 6 at most)")
        before = self._expanded
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._count(1, mark)
        self._sizes[id(node)] = self._expanded - before
        return node

    def _count(self, nodes: int, mark) -> None:
        self._expanded += nodes
        if self._expanded > MAX_SPEC_NODES:
            raise _BoundCrossed(mark, f"more than {MAX_SPEC_NODES:,} YAML nodes with its aliases expanded (the "
                                      "bound on a spec's size; the shipped ones have 3,000 at most): an alias "
                                      "here names too much (nested aliases multiply)")


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
        raw = read_at_most(path, MAX_SPEC_BYTES)  # whatever the file is (a FIFO, /dev/zero)
    except OSError as err:
        raise ConfigError(f"cannot read spec {path}: {err.strerror}") from None
    if raw is None:
        raise ConfigError(f"{path}: more than {MAX_SPEC_BYTES // 1024} KiB, the bound on a spec file's size "
                          "(the largest shipped YAML file has 43 KiB)")
    try:
        text = decode_text(raw)  # newlines read as read_text reads them
    except UnicodeDecodeError as err:
        raise ConfigError(non_utf8(path, err)) from None
    loader = _SpecLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as err:
        raise ConfigError(yaml_error(path, err)) from None
    except _BoundCrossed as err:
        raise ConfigError(f"{path}:{err.mark.line + 1}: {err.message}") from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    if node is not None:
        _index_lines(node, (), lines, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a spec is a YAML mapping (name, base, matrix, ...), got {type(data).__name__}")
    return data, lines


from solbench.text.spec_text import non_utf8  # noqa: E402,F401  (a leaf module: the report shares it)


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
