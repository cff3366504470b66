"""pyproject.toml lists solbench's packages one by one (solbench.methods lives in methods/), so a package
split out of a module must be listed there too.

Bug caught: after solbench/launch.py became the package solbench/launch/, an editable install still worked
(its finder maps the top-level folder) while a wheel or a non-editable install left the package out, and
`import solbench.launch` failed on that machine only."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject_and_every_listed_package_exists():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    dirs = setuptools["package-dir"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "solbench").rglob("__init__.py")}
    on_disk |= {"solbench.methods"} if (ROOT / dirs["solbench.methods"] / "__init__.py").is_file() else set()
    assert on_disk - listed == set(), "packages missing from pyproject.toml [tool.setuptools] packages"
    assert listed - on_disk == set(), "pyproject.toml lists packages that do not exist"
