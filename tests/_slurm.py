"""Whether the local Slurm test cluster answers (slurm/local-cluster.sh up); shared by the Slurm tests.

Tests that need the cluster skip with this reason only when it is down; CI brings it up, so there
they run.
"""

from __future__ import annotations

import shutil
import subprocess


def slurm_up() -> tuple[bool, str]:
    """(True, "") when `scontrol ping` reports the controller UP, else (False, why)."""
    if shutil.which("scontrol") is None:
        return False, "Slurm is not installed (run: bash slurm/local-cluster.sh up)"
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as err:
        return False, f"scontrol ping failed: {err}"
    if out.returncode != 0 or "UP" not in out.stdout:
        return False, ("no Slurm controller answers scontrol ping (run: bash slurm/local-cluster.sh up): "
                       f"{out.stdout.strip()} {out.stderr.strip()}")
    return True, ""
