"""solbench's modules import in layers, with no circle: a module never imports, even lazily inside a
function, a module that imports it back (directly or through others).

A lazy import hides a circle from Python but not from a reader: solbench.models.diffusers_common
once imported the doctor for a constant while the doctor imports the models package, so the lowest
layer reached up to the highest (issue 27). The graph is read from the source with ``ast``: every
``import`` and ``from ... import`` anywhere in a module of solbench/ or methods/ (installed as
solbench.methods) that names another of them. A submodule naming its own parent package is not a
circle (the parent is already importing it).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ((ROOT / "solbench", "solbench"), (ROOT / "methods", "solbench.methods"))


def module_sources() -> dict[str, tuple[str, bool]]:
    """{dotted module name: (source text, is a package __init__)} for solbench and its methods."""
    found = {}
    for folder, package in PACKAGES:
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join([package] + (parts[:-1] if is_package else parts))
            found[name] = (path.read_text(encoding="utf-8"), is_package)
    return found


def import_graph(sources: dict[str, tuple[str, bool]]) -> nx.DiGraph:
    """Edges module -> module it imports (anywhere in its body), among ``sources`` only."""
    graph = nx.DiGraph()
    for name, (text, is_package) in sources.items():
        graph.add_node(name)
        package = name if is_package else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join(base + ([node.module] if node.module else []))
                # `from pkg import sub` imports the submodule; `from mod import name`, the module
                targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in sources else module for a in node.names]
            else:
                continue
            for target in targets:
                if target in sources and target != name and not name.startswith(target + "."):
                    graph.add_edge(name, target)
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted((c for c in nx.simple_cycles(graph)), key=len)


def test_no_module_of_solbench_imports_a_module_that_imports_it_back():
    found = cycles(import_graph(module_sources()))
    assert not found, "import cycles (a module reaches one that imports it back):\n" + "\n".join(
        " -> ".join(c + [c[0]]) for c in found[:10])


def test_the_cycle_check_finds_a_cycle_when_one_is_added():
    # The check itself could be blind (a wrong module name, relative imports misread): add a lazy
    # import of a high layer to a leaf, as diffusers_common's import of the doctor was, and expect it.
    sources = module_sources()
    text, is_package = sources["solbench.engine.noise"]
    sources["solbench.engine.noise"] = (text + "\n\ndef _later():\n    from .engine import Engine\n", is_package)
    found = cycles(import_graph(sources))
    assert any({"solbench.engine.noise", "solbench.engine.engine"} <= set(c) for c in found), found[:3]
    # and a relative `from . import x` inside a package resolves to the sibling module
    text, is_package = sources["solbench.quant.recipes"]
    sources["solbench.quant.recipes"] = (text + "\n\ndef _later():\n    from . import model\n", is_package)
    assert import_graph(sources).has_edge("solbench.quant.recipes", "solbench.quant.model")
