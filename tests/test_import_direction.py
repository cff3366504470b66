"""Imports point down the stages of solbench/stages.py: a module imports only its own stage and the stages below it.

Bugs caught: a lower stage reaching up to a higher one (the trainer importing the doctor for its memory model, the
report importing the sweep for its curve maths, the spec importing the speed block for its arms: each drags a
driver onto a path that must load without it); a new package or top-level module placed in no stage (so the rule
silently does not hold for it) or a stage naming a package that is gone; and a package's docstring still naming
the stages it could import before the list changed. Every ``import`` and ``from ... import`` counts, at module
level and inside functions, relative ones resolved: a lazy import hides the dependency from Python, not from a
reader.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from solbench.stages import STAGES, Stage, below

ROOT = Path(__file__).resolve().parents[1]
#: (folder, the package it is installed as): solbench/ and the built-in methods (methods/, solbench.methods)
TREES = ((ROOT / "solbench", "solbench"), (ROOT / "methods", "solbench.methods"))


def modules(trees: Iterable[tuple[Path, str]]) -> dict[str, tuple[Path, bool]]:
    """{dotted module name: (its file, whether it is a package's __init__)} of every .py file under the trees."""
    found = {}
    for folder, package in trees:
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join([package] + (parts[:-1] if is_package else parts))] = (path, is_package)
    return found


def shown(path: Path, trees: Iterable[tuple[Path, str]]) -> str:
    """``path`` as the tree's folder and below (solbench/spec/resolver.py, methods/sol_rl.py)."""
    folder = next(folder for folder, _ in trees if path.is_relative_to(folder))
    return str(path.relative_to(folder.parent))


def stage_of(module: str, stages: Sequence[Stage]) -> str | None:
    """The stage holding ``module`` (its longest ``holds`` entry), None when no stage holds it."""
    name = "__init__" if module == "solbench" else module.removeprefix("solbench.")
    best = None
    for stage in stages:
        for held in stage.holds:
            if (name == held or name.startswith(held + ".")) and (best is None or len(held) > len(best[0])):
                best = (held, stage.name)
    return best and best[1]


def imported(module: str, path: Path, is_package: bool, known: Iterable[str]) -> list[tuple[int, str]]:
    """(line, module of solbench it imports) for every import anywhere in ``path``'s source."""
    known = set(known)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: up level - 1 packages from this module's own
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from pkg import sub` imports the submodule; `from mod import name`, the module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c`: the deepest module of solbench it names
                target = target.rpartition(".")[0]
            if target:
                found.append((node.lineno, target))
    return found


def upward_imports(trees: Iterable[tuple[Path, str]], stages: Sequence[Stage]) -> list[str]:
    """'file:line -> target (stage a imports stage b above it)' for every import pointing up ``stages``."""
    trees = tuple(trees)
    found = modules(trees)
    rank = {stage.name: i for i, stage in enumerate(stages)}
    bad = []
    for module, (path, is_package) in found.items():
        mine = stage_of(module, stages)
        for line, target in imported(module, path, is_package, found):
            theirs = stage_of(target, stages)
            if mine is not None and theirs is not None and rank[theirs] < rank[mine]:
                bad.append(f"{shown(path, trees)}:{line} -> {target} (stage {mine} imports stage {theirs}, above it)")
    return sorted(set(bad))


def unplaced(trees: Iterable[tuple[Path, str]], stages: Sequence[Stage]) -> list[str]:
    """The modules no stage holds."""
    return sorted(m for m in modules(trees) if stage_of(m, stages) is None)


def placed_nothing(trees: Iterable[tuple[Path, str]], stages: Sequence[Stage]) -> list[str]:
    """'stage: entry' for every ``holds`` entry that names no module (a package moved or gone)."""
    names = {("__init__" if m == "solbench" else m.removeprefix("solbench.")) for m in modules(trees)}
    return [f"{stage.name}: {held}" for stage in stages for held in stage.holds
            if not any(n == held or n.startswith(held + ".") for n in names)]


def stage_sentence(name: str) -> str:
    """What the docstring of a package of stage ``name`` says of its imports (solbench/stages.py's rule)."""
    lower = below(name)
    if not lower:
        return f"Stage ``{name}`` (solbench/stages.py), the lowest: it imports only its own modules."
    return (f"Stage ``{name}`` (solbench/stages.py): it imports its own modules and the stages below it, "
            f"{', '.join(lower)}.")


def test_every_module_is_in_one_stage_and_every_stage_entry_exists():
    """Bug: a new package or module placed in no stage (the direction check then passes over it), an entry of the
    stage list left behind by a move, or one package in two stages."""
    assert unplaced(TREES, STAGES) == [], "modules in no stage of solbench/stages.py (place them there)"
    assert placed_nothing(TREES, STAGES) == [], "solbench/stages.py holds entries that name no module"
    held = [held for stage in STAGES for held in stage.holds]
    assert len(held) == len(set(held)), "an entry of solbench/stages.py is in two stages"


def test_no_import_points_up_the_stages():
    """Bug: a lower stage importing a higher one, as train/rollout_copy.py once imported the doctor and
    report/ the sweep's curve maths."""
    found = upward_imports(TREES, STAGES)
    assert found == [], "imports pointing up solbench/stages.py (move the code down, or the import):\n" + "\n".join(
        found)


def test_the_check_finds_an_upward_import_and_an_unplaced_module(tmp_path):
    """Bug: a blind checker (a relative import misread, a function-level import skipped, a module named wrong),
    which would pass any tree: a fake tree with lazy imports pointing up (relative and absolute), one pointing
    down, a module in no stage and a stage entry naming nothing, each found or left alone as it should be."""
    tree = tmp_path / "solbench"
    for folder in ("high", "low"):
        (tree / folder).mkdir(parents=True)
        (tree / folder / "__init__.py").write_text('"""A stage."""\n')
    (tree / "__init__.py").write_text("")
    (tree / "high" / "driver.py").write_text("from solbench.low import leaf\n\n\ndef run():\n    return leaf\n")
    (tree / "low" / "leaf.py").write_text("import json\n\n\ndef later():\n    from ..high import driver\n"
                                          "    import solbench.high.driver as again\n    return driver, again\n")
    (tree / "stray.py").write_text("")
    stages = (Stage("high", ("high",), ""), Stage("low", ("low", "__init__"), ""))
    trees = ((tree, "solbench"),)
    assert upward_imports(trees, stages) == [
        "solbench/low/leaf.py:5 -> solbench.high.driver (stage low imports stage high, above it)",
        "solbench/low/leaf.py:6 -> solbench.high.driver (stage low imports stage high, above it)"]
    assert unplaced(trees, stages) == ["solbench.stray"]
    assert placed_nothing(trees, stages + (Stage("gone", ("gone",), ""),)) == ["gone: gone"]


def test_each_package_docstring_names_its_stage_and_what_it_may_import():
    """Bug: a package whose docstring names no stage, or the stages it could import before the list changed."""
    found = modules(TREES)
    wrong = []
    for stage in STAGES:
        for held in stage.holds:
            module = "solbench" if held == "__init__" else f"solbench.{held}"
            path, is_package = found.get(module, (None, False))
            if not is_package:
                continue
            doc = re.sub(r"\s+", " ", ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "")
            if stage_sentence(stage.name) not in doc:
                wrong.append(f"{path.relative_to(ROOT)}: lacks {stage_sentence(stage.name)!r}")
    assert wrong == [], "\n".join(wrong)
