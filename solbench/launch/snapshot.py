"""Code snapshots for Slurm jobs: the solbench code of submission time, copied where jobs import it first."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from solbench.results import capture_env

from .execute import _now

CODE_SNAPSHOT_ENV = "SOLBENCH_CODE_SNAPSHOT"


def snapshot_code(dest_root: Path) -> Path:
    """Copy the solbench code running now into ``dest_root/<content hash>/``; returns that folder.

    Slurm jobs may start hours after submission and requeued jobs start again later still; with the
    snapshot first on their PYTHONPATH they run the code of submission time, not whatever the
    checkout holds by then. The copy has the installed layout (solbench/, with methods/ as
    solbench/methods/), so it imports without the editable install's path mapping. Identical code
    shares one snapshot; CODE.json beside it records where it came from and the git state.
    """
    import hashlib

    import solbench
    import solbench.methods

    package = Path(solbench.__file__).resolve().parent
    methods = Path(solbench.methods.__file__).resolve().parent
    sources = {Path("solbench"): package}
    if methods != package / "methods":  # a checkout: methods/ at the top maps to solbench.methods
        sources[Path("solbench/methods")] = methods
    files: list[tuple[Path, Path]] = []  # (relative destination, source)
    for rel_root, root in sources.items():
        for path in sorted(root.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".pyo"):
                files.append((rel_root / path.relative_to(root), path))
    digest = hashlib.sha256()
    for rel, path in files:
        digest.update(str(rel).encode() + b"\0" + path.read_bytes() + b"\0")
    snapshot = Path(dest_root) / digest.hexdigest()[:16]
    if (snapshot / "CODE.json").exists():
        return snapshot.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=_mkdir(Path(dest_root))))
    for rel, path in files:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, tmp / rel)
    env = capture_env()
    meta = {"source": {str(k): str(v) for k, v in sources.items()}, "files": len(files),
            "git_sha": env.get("git_sha"), "git_dirty": env.get("git_dirty"), "created_at": _now()}
    (tmp / "CODE.json").write_text(json.dumps(meta, indent=2) + "\n")
    try:
        os.replace(tmp, snapshot)
    except OSError:  # another submission made the same snapshot meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return snapshot.resolve()


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
