"""Launch profiles: ``load_profile`` finds and validates slurm/profiles/<name>.yaml, ``check_launch`` checks
a spec's runs against the profile they launch with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import ValidationError

from solbench.errors import ConfigError
from solbench.spec.models import NAME_PATTERN, ProfileModel, _format_validation_error
from solbench.spec.plan import ExperimentSpec
from solbench.spec.yaml_lines import load_yaml


def profile_search_path(spec_path: Path | None = None) -> list[Path]:
    """Folders searched for slurm/profiles/<name>.yaml: next to the spec's project, cwd, the checkout."""
    roots = []
    if spec_path is not None:
        roots.append(Path(spec_path).resolve().parent.parent)
    roots += [Path.cwd(), Path(__file__).resolve().parents[2]]
    return list(dict.fromkeys(root / "slurm" / "profiles" for root in roots))


def load_profile(name: str, spec_path: Path | None = None) -> tuple[str, ProfileModel]:
    """(path, profile) for a profile name (``local``, ``debug``, ...) or a .yaml path."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        candidates = [Path(name)]
        if spec_path is not None:
            candidates.insert(0, Path(spec_path).parent / name)
    else:
        if not re.match(NAME_PATTERN, name):
            raise ConfigError(f"launch profile {name!r} is not a valid profile name")
        candidates = [folder / f"{name}.yaml" for folder in profile_search_path(spec_path)]
    for path in candidates:
        if path.is_file():
            data, lines = load_yaml(path)
            try:
                return str(path), ProfileModel.model_validate_json(json.dumps(data), strict=True)
            except ValidationError as err:
                raise _format_validation_error(err, str(path), lines, ProfileModel) from None
    if name == "local":  # the default works without any profile file
        return "<builtin local>", ProfileModel(executor="local", workers="auto",
                                               description="this machine, one run per core at a time")
    known = sorted({p.stem for folder in profile_search_path(spec_path) if folder.is_dir()
                    for p in folder.glob("*.yaml")})
    raise ConfigError(f"launch profile {name!r} not found (looked in {', '.join(str(c) for c in candidates)}); "
                      f"profiles: {', '.join(known) or 'none'}")


def check_launch(spec: ExperimentSpec, profile_path: str, profile: ProfileModel) -> None:
    """Ranks per run against the launch profile, before anything is submitted.

    On Slurm each rank of a run is one task (one per GPU), so world_size must equal nodes x
    tasks_per_node, and a GPU profile runs one task per GPU.
    """
    if profile.executor != "slurm":
        return
    ranks = profile.nodes * profile.tasks_per_node
    if profile.gpus_per_node and profile.tasks_per_node != profile.gpus_per_node:
        raise ConfigError(f"{profile_path}: tasks_per_node={profile.tasks_per_node} but gpus_per_node="
                          f"{profile.gpus_per_node}; solbench runs one rank (task) per GPU, set them equal")
    cpus = profile.cpus_per_task
    short = sorted({r.config.numerics.threads for r in spec.runs
                    if r.config.numerics.threads > cpus and r.config.device != "cuda"})
    if short:  # a CPU run given fewer cores than its threads could not compute the numbers its config sets
        raise ConfigError(f"{spec.path}: numerics.threads {', '.join(map(str, short))} exceeds the launch profile "
                          f"{profile_path}'s cpus_per_task={cpus}; give each task at least that many CPUs or lower "
                          "numerics.threads")
    wrong = sorted({r.config.world_size for r in spec.runs if r.config.world_size != ranks})
    if wrong:
        raise ConfigError(f"{spec.path}: world_size {', '.join(map(str, wrong))} does not match launch profile "
                          f"{profile_path}, which starts nodes x tasks_per_node = {profile.nodes} x "
                          f"{profile.tasks_per_node} = {ranks} ranks per run; set world_size: {ranks} or use a "
                          "profile with that many tasks")
