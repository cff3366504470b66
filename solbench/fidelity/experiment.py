"""The standalone ranking-fidelity experiment (`solbench fidelity`): the unbiased version of Table 8.

Sol-RL's training data only has full-precision rewards for the K selected seeds, so rank correlations
computed from it are conditioned on the selection. This experiment takes one fixed checkpoint (the
policy of a run's latest checkpoint, LoRA merged for the explore copy, or the base model) and, with
no training, samples M prompts x N seeds at both precisions from the same candidate noise:

- explore: the low-precision copy (``--recipe``, default the model's Sol-RL recipe) with the short
  explore budget (``explore_steps``), as Sol-RL's explore stage;
- full: the full-precision network with the full budget (``steps``), as its regenerate stage;

every image scored by every reward (``solbench.report.fidelity_sampling.fidelity_experiment``). The
networks are built by the trainer's own code (``solbench.train.trainer.build_policy_nets``, PolicyNets,
``quant_explore_fns``) and the checkpoint is loaded by ``PolicyNets.load_state_dict``, so the
explore copy is exactly the one the run would have explored with.

The result is an ordinary experiment folder, ``results/<name>/<run_id>/`` (spec.json, env.json,
status.json, candidates.jsonl with a ``reward_name`` column, timings.jsonl), collected into parquet
(``solbench.collect``) and reported by the ``ranking_fidelity`` report kind, where every
prompt group is an "all seeds" group. The run id hashes the experiment's settings, so runs with other
settings (say ``explore_steps`` 6 and 10, or ``recipe`` none to isolate the step-count effect) sit
side by side in one experiment and appear as separate arms of its report.

One job, about 460 lines: a fidelity run from its settings to its stored candidates (``resolve``, ``build_engine``,
``sample``, ``run``) and a spec's ``fidelity:`` block as several such runs (``run_spec_block``: settings per entry
and recipe, worker processes, ``fidelity_run_ids``). Which checkpoints a block names is solbench.spec.fidelity_plan's,
its validation solbench.spec.fidelity_block's, its report solbench.report.fidelity*; the block runner stays here
because it is ``run`` in a loop over settings, with no state of its own, and the block's workers and the tests reach
``run`` through this module. It is the seam to split next (fidelity/block.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from solbench.config import ModelConfig, NumericsConfig, QuantConfig
from solbench.errors import ConfigError
from solbench.fidelity.checkpoint import Checkpoint, load_checkpoint
from solbench.machine.threads import cpu_allocation
from solbench.models import DEFAULT_EXPLORE_RECIPES

log = logging.getLogger(__name__)

#: ``recipe`` value for a full-precision explore copy (the explore role then runs the policy itself):
#: with a shorter ``explore_steps`` it measures the step-count effect alone.
NO_QUANT = "none"
METHOD = "fidelity"  # the runs' method name in runs.parquet (the report's arm label)


@dataclass
class FidelitySettings:
    """One fidelity run: what to sample and how. ``None`` fields take the checkpoint run's (or model's) value."""

    name: str | None = None  # experiment name (default fidelity_<model>)
    model: str | None = None  # tiny | flux | sd3 | sana (default: the checkpoint's model, else tiny)
    model_path: str | None = None
    resolution: int | None = None
    checkpoint: str | None = None  # run folder or checkpoint file; None = the base model
    role: str = "policy"  # the checkpoint's network to measure: policy | ema | old
    prompts: str | None = None  # prompt set name or file (default: the run's eval prompts, else shapes/eval)
    n_prompts: int | None = 16
    seeds: int = 32
    steps: int = 10
    explore_steps: int = 6
    sampler: str | None = None  # default: the checkpoint run's method sampler, else Sol-RL's (dpm2)
    guidance: float | None = None
    shift: float | None = None
    recipe: str | None = None
    # emulated | te | torch | cpu_bf16 | auto (default: the run's, emulated where the run's cpu_bf16 cannot run the
    # recipe; else emulated on CPU, te on CUDA)
    backend: str | None = None
    rewards: list[str] = field(default_factory=list)  # weight 1 each; default: the run's training rewards
    # (with their weights), else shapes_geneval for tiny
    run_seed: int = 0
    device: str = "auto"
    batch_seeds: int | None = None
    threads: int | None = None  # CPU threads (numerics.threads); default: the checkpoint run's, else 1


def resolve(settings: FidelitySettings, checkpoint: Checkpoint | None = None) -> dict[str, Any]:
    """The fully resolved settings of a fidelity run (what spec.json records and the run id hashes)."""
    from solbench import rewards as reward_registry
    from solbench.method import get_method

    run = checkpoint.config if checkpoint is not None else None
    model = settings.model or (run.model.name if run else "tiny")
    if run is not None and settings.model and settings.model != run.model.name:
        raise ConfigError(f"--model {settings.model}: the checkpoint was trained on {run.model.name!r}")
    model_cfg = dataclasses.replace(run.model) if run else ModelConfig(name=model)
    if settings.model_path is not None:
        model_cfg.path = settings.model_path
    if settings.resolution is not None:
        model_cfg.resolution = settings.resolution
    recipe = settings.recipe or (run.quant.recipe if run and "explore" in get_method(run.method).nets else None) \
        or DEFAULT_EXPLORE_RECIPES.get(model)  # the model card's explore recipe
    if recipe is None:
        raise ConfigError(f"--recipe: no default quantization recipe for model {model!r}; name one")
    check_recipe(recipe)
    from solbench.train.trainer import resolve_device

    device = resolve_device(settings.device)
    backend = settings.backend or (run.quant.backend if run else ("emulated" if device.type == "cpu" else "te"))
    if not settings.backend and backend == "cpu_bf16" and recipe != NO_QUANT:
        from solbench.quant import get_recipe
        from solbench.quant.backends import unavailable_reason

        if unavailable_reason(get_recipe(recipe), "cpu_bf16") is not None:  # the registry's answer, decided once
            backend = "emulated"  # the run's cpu_bf16 cannot run this recipe (MXFP4, weight-only): as the run's auto would
    if settings.rewards:
        rewards = {name: 1.0 for name in settings.rewards}
    else:
        rewards = dict(run.rewards) if run else ({"shapes_geneval": 1.0} if model == "tiny" else {})
    if not rewards:
        raise ConfigError(f"--rewards: name the rewards to rank with for model {model!r} "
                          f"(known: {', '.join(reward_registry.names())})")
    for name in rewards:
        if name not in reward_registry.names():
            reward_registry.get(name)  # raises, naming close matches
    prompts = settings.prompts or (run.eval.prompts if run else ("shapes/eval" if model == "tiny" else None))
    if prompts is None:
        raise ConfigError(f"--prompts: name a prompt set or file for model {model!r}")
    sampler = settings.sampler
    if sampler is None:
        method_sampler = (run.method_config.get("sampler") if run else None)
        sampler = method_sampler or get_method("sol_rl").Config().sampler
    guidance = settings.guidance if settings.guidance is not None else (run.sampling.guidance if run else None)
    shift = settings.shift if settings.shift is not None else (run.sampling.shift if run else None)
    for label, value in (("--steps", settings.steps), ("--threads", settings.threads),
                         ("--explore-steps", settings.explore_steps), ("--n-prompts", settings.n_prompts)):
        if value is not None and value < 1:
            raise ConfigError(f"{label} must be >= 1, got {value}")
    if settings.explore_steps > settings.steps:
        raise ConfigError(f"--explore-steps {settings.explore_steps} exceeds --steps {settings.steps}: the explore "
                          "stage is the short one; lower --explore-steps or raise --steps")
    from solbench.report.fidelity import MIN_PAIRS

    if settings.seeds < MIN_PAIRS:  # the report ranks no group of fewer seeds
        raise ConfigError(f"--seeds must be >= {MIN_PAIRS} to rank seeds (rank correlations over fewer are not "
                          f"reported), got {settings.seeds}")
    if settings.role not in ("policy", "ema", "old"):
        raise ConfigError(f"--role must be policy, ema or old, got {settings.role!r}")
    if checkpoint is not None and settings.role not in checkpoint.state["nets"]["trainable"]:
        raise ConfigError(f"--role {settings.role}: the checkpoint holds no {settings.role!r} weights (it has "
                          f"{', '.join(sorted(checkpoint.state['nets']['trainable']))})")
    return {
        "experiment": settings.name or f"fidelity_{model}",
        "kind": "fidelity",
        "method": METHOD,
        "seed": settings.run_seed,
        "model": dataclasses.asdict(model_cfg),
        "checkpoint": None if checkpoint is None else {
            "path": str(checkpoint.path), "run_id": checkpoint.run_id, "method": run.method, "step": checkpoint.step,
            "role": settings.role},
        "prompts": {"set": str(prompts), "n_prompts": settings.n_prompts},
        "seeds": settings.seeds,
        "sampling": {"sampler": sampler, "steps": settings.steps, "explore_steps": settings.explore_steps,
                     "guidance": guidance, "shift": shift},
        "quant": {"recipe": recipe, "backend": backend},
        "rewards": rewards,
        "device": settings.device,
        # the thread count changes the numbers on CPU (solbench.machine.threads): the run's, fixed like any setting
        "numerics": {"threads": settings.threads or (run.numerics.threads if run else NumericsConfig().threads)},
    }


def check_recipe(recipe: str | None, flag: str = "--recipe") -> None:
    """ConfigError naming ``flag`` for an unknown explore recipe (None, the default, and NO_QUANT are known), so
    that a command checks every recipe it is given before any work."""
    if recipe is None or recipe == NO_QUANT:
        return
    from solbench.quant import UnknownRecipeError, get_recipe

    try:
        get_recipe(recipe)
    except UnknownRecipeError as err:
        raise ConfigError(f"{flag} {recipe}: {err}") from None


def run_id_of(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()[:12]


def build_engine(spec: dict, checkpoint: Checkpoint | None = None):
    """An Engine whose "policy" is the measured full-precision network and "explore" its low-precision copy.

    With a checkpoint: the run's PolicyNets (``solbench.train.trainer.build_policy_nets``) with the explore
    copy mirroring ``role``, loaded from the checkpoint (LoRA merged into the explore copy). Without:
    the base model and its quantized copy.
    """
    from solbench.engine.engine import Engine
    from solbench.models import build_adapter
    from solbench.rewards import RewardSet
    from solbench.engine.timing import PhaseTimer
    from solbench.train.trainer import build_policy_nets, quant_explore_fns, resolve_device

    device = resolve_device(spec["device"])
    recipe, backend = spec["quant"]["recipe"], spec["quant"]["backend"]
    adapter = build_adapter(ModelConfig(**spec["model"]), device)
    quant_cfg = QuantConfig(recipe=recipe if recipe != NO_QUANT else QuantConfig().recipe, backend=backend)
    if recipe == NO_QUANT:  # the explore role runs the full-precision network itself
        explore_fns = (lambda module: module, lambda explore, source: None)
    else:
        explore_fns = quant_explore_fns(quant_cfg)
    if checkpoint is None:
        policy = adapter.transformer.requires_grad_(False)
        explore = explore_fns[0](policy)
    else:
        role = checkpoint_role(spec)
        roles = set(checkpoint.state["nets"]["trainable"]) | {role, "explore"}
        if recipe == NO_QUANT:  # a copy of the merged weights stands in for the quantized one
            import copy

            explore_fns = (lambda module: copy.deepcopy(module),
                           lambda explore, source: explore.load_state_dict(source.state_dict()))
        # the Engine below samples through `role` and the explore copy only: no merged rollout copy to build
        config = dataclasses.replace(checkpoint.config,
                                     model=dataclasses.replace(checkpoint.config.model, rollout_copy="lora"))
        nets = build_policy_nets(config, adapter, roles, explore_source=role, explore=explore_fns)
        nets.load_state_dict(checkpoint.state["nets"])  # re-syncs the explore copy from `role`
        policy, explore = nets[role], nets["explore"]
    rewards = RewardSet(dict(spec["rewards"]), device)
    return Engine(adapter, {"policy": policy, "explore": explore}, rewards, PhaseTimer(), spec["seed"], device,
                  explore_recipe=recipe)


def model_identity(model: dict, transformer) -> dict:
    """What names the weights a run measured: the sha256 of the tiny model's weights file (the shipped one, or the
    one in ``model.path``), its width (attention heads x head dim) and parameter count. Real models (Hugging Face
    ids, gigabytes) are not hashed: their ``path`` names them."""
    config = getattr(transformer, "config", None)
    heads, head_dim = getattr(config, "num_attention_heads", None), getattr(config, "attention_head_dim", None)
    out = {"width": int(heads) * int(head_dim) if heads and head_dim else None,
           "parameters": int(sum(p.numel() for name, p in transformer.named_parameters() if "lora_" not in name)),
           "weights": None, "sha256": None}
    if model.get("name") == "tiny":
        from solbench.models.tiny import ASSET_NAME, asset_path

        weights = (Path(model["path"]).expanduser() / f"{ASSET_NAME}.safetensors" if model.get("path")
                   else asset_path(f"{ASSET_NAME}.safetensors"))
        if weights.is_file():
            out["weights"] = str(weights)
            out["sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    return out


def record_mac_share(spec: dict, engine, store) -> dict:
    """The spec with ``quant.mac_share`` added, also written to the run's spec.json: the share of the
    transformer's Linear multiply-accumulates the explore copy runs in low precision (one forward at
    batch 1, ``solbench.quant.low_precision_mac_share``; 0 for recipe none), and ``quant.quantized_linears``
    of ``quant.linears``; and ``model_identity`` (``model_identity``: the weights' sha256, width and size),
    which the report's header names the model by. Measured from the built copy and the weights file, so
    neither is part of what the run id hashes."""
    from solbench.quant import low_precision_mac_share
    from solbench.world.prompts import load_prompt_set

    quant = dict(spec["quant"])
    if quant["recipe"] == NO_QUANT:
        quant.update(mac_share=0.0, quantized_linears=0, linears=None)
    else:
        adapter, explore = engine.adapter, engine.nets["explore"]
        prompt = load_prompt_set(spec["prompts"]["set"])[0].text
        x = torch.zeros(1, *adapter.latent_shape, device=engine.device)
        t = torch.full((1,), 0.5, device=engine.device)
        share = low_precision_mac_share(explore, lambda: adapter.velocity(explore, x, t, adapter.encode([prompt])))
        quant.update(mac_share=round(share.share, 6), quantized_linears=share.quantized_layers, linears=share.layers)
    spec = {**spec, "quant": quant, "model_identity": model_identity(spec["model"], engine.adapter.transformer)}
    store.write_json("spec.json", spec)
    return spec


def checkpoint_role(spec: dict) -> str:
    return (spec.get("checkpoint") or {}).get("role", "policy")


def sample(spec: dict, engine, *, batch_seeds: int | None = None) -> pd.DataFrame:
    """The candidates table of one fidelity run (``fidelity_experiment`` on the spec's prompts)."""
    from solbench.report.fidelity_sampling import fidelity_experiment
    from solbench.engine.sampling import SamplerSpec
    from solbench.world.prompts import load_prompt_set

    records = load_prompt_set(spec["prompts"]["set"])
    n = spec["prompts"]["n_prompts"]
    if n is not None:
        if n > len(records):
            raise ConfigError(f"--n-prompts {n}: the prompt set {spec['prompts']['set']!r} has {len(records)} prompts")
        records = records[:n]
    s = spec["sampling"]
    full = SamplerSpec(s["sampler"], s["steps"], guidance=s["guidance"], shift=s["shift"])
    explore = SamplerSpec(s["sampler"], s["explore_steps"], guidance=s["guidance"], shift=s["shift"])
    frame = fidelity_experiment(engine, [{"id": r.id, "text": r.text} for r in records], spec["seeds"],
                                explore_sampler=explore, full_sampler=full, run_id="", batch_seeds=batch_seeds)
    if list(spec["rewards"].values()) == [1.0]:  # "total" is the one reward itself: keep it once, by name
        frame = frame[frame["reward_name"] != "total"].reset_index(drop=True)
    return frame


def run(settings: FidelitySettings, results_root: str | Path = "results", *, force: bool = False,
        echo=print) -> tuple[dict, Path]:
    """Run (or reuse, when done and not ``force``) one fidelity run; returns (spec, run folder)."""
    from solbench.results import RunStore, capture_env

    given = [key for key, value in (("eval.prompts", settings.prompts), ("model.path", settings.model_path)) if value]
    checkpoint = load_checkpoint(settings.checkpoint, given=given) if settings.checkpoint else None
    for note in checkpoint.notes if checkpoint is not None else ():
        echo(note)
    spec = resolve(settings, checkpoint)
    rid = run_id_of(spec)
    store = RunStore(Path(results_root) / spec["experiment"] / rid, rid)
    if store.read_status().get("state") == "done" and not force:
        echo(f"fidelity run {rid} is done already (results in {store.run_dir}; --force reruns it)")
        return store.read_json("spec.json") or spec, store.run_dir
    store.clear()
    store.write_json("spec.json", spec)
    started = time.time()
    store.write_status("running", attempt=1, started_at=_now())
    try:
        # threads as for a training run: its numerics.threads, on claimed cores where free (solbench.machine.threads)
        with cpu_allocation(spec.get("numerics", {}).get("threads", 1),
                            device="cuda" if torch.cuda.is_available() else "cpu") as cpus:
            store.write_json("env.json", capture_env(cpus=cpus))
            engine = build_engine(spec, checkpoint)
            spec = record_mac_share(spec, engine, store)
            frame = sample(spec, engine, batch_seeds=settings.batch_seeds)
        store.append("candidates", frame.drop(columns=["run_id"]).to_dict("records"))
        timings = [row.row() for row in engine.timer.drain()]
        for row in timings:
            row["step"] = 0
        store.append("timings", timings)
    except Exception as err:
        store.write_status("failed", attempt=1, error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc(),
                           seconds=round(time.time() - started, 3), finished_at=_now())
        raise
    seconds = round(time.time() - started, 3)
    store.write_status("done", attempt=1, seconds=seconds, finished_at=_now())
    echo(f"fidelity run {rid}: {frame['prompt_id'].nunique()} prompts x {spec['seeds']} seeds at both precisions "
         f"in {seconds:.1f} s -> {store.run_dir}")
    return spec, store.run_dir


def summary(candidates: pd.DataFrame, ks=(4, 8, 12)) -> pd.DataFrame:
    """Mean per-prompt Kendall tau, Spearman rho and hit@K per (run, reward), as the report computes them."""
    from solbench.report.fidelity import group_fidelity, pair_candidates

    groups = group_fidelity(pair_candidates(candidates), tuple(ks))
    keys = ["run_id"] + (["reward_name"] if "reward_name" in groups else [])
    cols = [c for c in groups.columns if c in ("kendall_tau", "spearman_rho") or c.startswith(("hit@", "overlap@"))]
    out = groups.groupby(keys)[cols].mean()
    out.insert(0, "groups", groups.groupby(keys).size())
    return out.reset_index()


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# ---- a spec's `fidelity:` block: the main job ends with the unbiased measurement ---------------------

def run_spec_block(spec, results_root: str | Path = "results", *, force: bool = False, echo=print) -> list[str]:
    """Run the fidelity runs of ``spec.fidelity`` (solbench.spec.FidelityBlock) after training; returns their
    run ids. One run per checkpoint and recipe of the block (default: the checkpoint run's recipe), written to
    ``results/<spec name>/<fidelity run id>/`` beside the training runs, so the experiment's report shows
    them. The checkpoints (solbench.spec.fidelity_plan): ``base``, a method's main run (its final checkpoint), or a
    mapping naming an arm, run seeds and kept steps. Nothing runs for a checkpoint whose run is not done. Where
    several runs are to be made on CPU, they run side by side, one per core (each claims its cores as a training
    run does, solbench.machine.threads), as many at once as ``solbench run`` runs training runs."""
    block = spec.fidelity
    if block is None:
        return []
    todo = _block_settings(spec, block, results_root, echo)
    workers = _block_workers(len(todo))
    if workers < 2:
        return [run(settings, results_root, force=force, echo=echo)[1].name for settings in todo]
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_run_in_worker, settings, str(results_root), force) for settings in todo]
        return [future.result() for future in futures]


def _run_in_worker(settings: FidelitySettings, results_root: str, force: bool) -> str:
    return run(settings, results_root, force=force)[1].name


def _block_workers(n: int) -> int:
    """Fidelity runs at once: one per core this process may use (``--workers`` / SOLBENCH_WORKERS where set), 1 on
    CUDA (GPU runs take turns) or for a single run."""
    import os

    from solbench.launch.local import WORKERS_ENV
    from solbench.machine.threads import available_cores

    if n < 2 or torch.cuda.is_available():
        return 1
    raw = os.environ.get(WORKERS_ENV, "").strip()
    workers = int(raw) if raw.isdigit() else len(available_cores())
    return max(1, min(workers, n))


def _block_settings(spec, block, results_root, echo) -> list[FidelitySettings]:
    """The FidelitySettings of every run the block makes now (solbench.spec.fidelity_plan.plan), each once."""
    from solbench.spec.fidelity_plan import plan
    from solbench.results import RunStore

    out, seen = [], set()
    for planned in plan(spec.runs, block):
        cfg, checkpoint = spec.runs[0].config, None
        if planned.run is not None:
            store = RunStore(spec.run_dir(results_root, planned.run.run_id), planned.run.run_id)
            if store.read_status().get("state") != "done":
                echo(f"fidelity: run {planned.run.run_id} ({planned.run.config.method}, seed {planned.run.config.seed}) "
                     "is not done; its checkpoint's all-seeds fidelity is not measured")
                continue
            cfg = planned.run.config
            checkpoint = str(store.run_dir if planned.step is None else
                             dict(store.checkpoint_files()).get(planned.step, store.checkpoint_dir / f"step_{planned.step:08d}.pt"))
        for recipe in planned.recipes or list(block.recipes) or [None]:
            key = (checkpoint, recipe)
            if key in seen:
                continue
            seen.add(key)
            out.append(FidelitySettings(
                name=spec.name, model=cfg.model.name, model_path=None if checkpoint else cfg.model.path,
                resolution=None if checkpoint else cfg.model.resolution, checkpoint=checkpoint, role=block.role,
                prompts=block.prompts or (None if checkpoint else cfg.eval.prompts), n_prompts=block.n_prompts,
                seeds=block.seeds, steps=block.steps, explore_steps=block.explore_steps, recipe=recipe,
                backend=None if checkpoint else cfg.quant.backend,
                rewards=list(block.rewards) or ([] if checkpoint else list(cfg.rewards)), device=cfg.device,
                batch_seeds=block.batch_seeds, threads=cfg.numerics.threads))
    return out


def fidelity_run_ids(experiment_dir: str | Path) -> list[str]:
    """The fidelity runs (spec.json kind 'fidelity') in an experiment folder, for collection beside its runs."""
    ids = []
    folder = Path(experiment_dir)
    if not folder.is_dir():
        return ids
    for run_dir in sorted(folder.iterdir()):
        spec_file = run_dir / "spec.json"
        if spec_file.is_file():
            try:
                if json.loads(spec_file.read_text()).get("kind") == "fidelity":
                    ids.append(run_dir.name)
            except ValueError:
                continue
    return ids
