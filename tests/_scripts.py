"""scripts/<name>.py loaded as a module, for the tests of the repository's scripts."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def script_module(name: str):
    """scripts/<name>.py, executed as a fresh module (its main is not run)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
