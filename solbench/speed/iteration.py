"""One real training iteration of a speed arm, timed per phase (the block's unit of work).

An arm's Trainer (solbench.train.trainer) is built once per process from the arm's config, in a private scratch
store: the same networks, explore copy (quant.backend resolved here), rollout, rewards and optimizer a run of
that config has, from the base model (or a checkpoint's policy, the same in every arm). Each call runs one
``train_iteration`` at a given step (the step picks the prompts, so every arm of a round draws the same ones) and
returns the phases its PhaseTimer timed: seconds, precision and load, synchronised on CUDA as for any run
(solbench.engine.timing). ``published`` builds the model and rewards at their published shapes with random weights, as
``solbench doctor SPEC --measure`` does (solbench.measure), for a GPU's Table 5 at true shapes.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import torch

from solbench.train.trainer import Trainer


class _TimedTrainer(Trainer):
    """A Trainer that keeps each iteration's timing rows instead of writing the run's tables."""

    def record_iteration(self, batch, stats, gap=None) -> None:
        self.timed = [r.row() for r in self.timer.drain()]


def timed_config(cfg):
    """The arm's config as the block runs it: no explore-gap measurement, no evaluation between iterations."""
    return dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, explore_gap_every=0))


class ArmRunner:
    """Callable ``runner(step) -> [phase rows]`` for one arm; ``backend`` / ``device_name`` say what it ran on."""

    def __init__(self, cfg, *, policy_state: list | None = None, published: bool = False) -> None:
        from solbench.results import RunStore

        self._scratch = tempfile.TemporaryDirectory(prefix="solbench_speed.")
        cfg = timed_config(cfg)
        store = RunStore(Path(self._scratch.name) / cfg.run_id, cfg.run_id)
        kwargs = {}
        if published:
            kwargs = _published_parts(cfg)
            cfg = kwargs.pop("cfg")
        self.trainer = _TimedTrainer(cfg, store, **kwargs)
        if policy_state is not None:
            with torch.no_grad():
                for dst, src in zip(self.trainer.params, policy_state, strict=True):
                    dst.copy_(src)
            self.trainer.nets.sync_explore_copy()
        choice = getattr(self.trainer.nets, "explore_backend", None)
        self.backend = choice.backend if choice is not None else "-"
        self.device_name = device_name(self.trainer.device)

    def __call__(self, step: int) -> list[dict]:
        self.trainer.step = step
        self.trainer.train_iteration()
        return self.trainer.timed

    def close(self) -> None:
        """Free the arm's networks (and, on CUDA, the memory they held) and its scratch store."""
        import gc

        cuda = self.trainer.device.type == "cuda"
        del self.trainer
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        self._scratch.cleanup()


def _published_parts(cfg) -> dict:
    """The model and rewards at published shapes with random weights (solbench.measure.published), one prompt
    group, world size 1, as solbench doctor --measure measures a method."""
    from solbench.measure.iteration import PROMPTS, _rewards
    from solbench.measure.published import build_adapter
    from solbench.train.trainer import resolve_device

    device = resolve_device(cfg.device)
    prompts = Path(tempfile.mkdtemp(prefix="solbench_speed_prompts.")) / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    cfg = dataclasses.replace(cfg, world_size=1, prompts_per_iter=1, train_prompts=str(prompts),
                              eval=dataclasses.replace(cfg.eval, prompts=str(prompts), n_prompts=None))
    adapter = build_adapter(cfg.model.name, device, torch.bfloat16, resolution=cfg.model.resolution,
                            cpu_offload=cfg.model.cpu_offload)
    if cfg.model.gradient_checkpointing:
        adapter.transformer.enable_gradient_checkpointing()
    rewards = _rewards([cfg], device, tiny=False)
    return {"cfg": cfg, "adapter": adapter, "reward_models": rewards}


def device_name(device: torch.device) -> str:
    """'NVIDIA H200 (sm_90)' or the CPU's model name."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"
    from solbench.machine.cpu import cpu_model

    return cpu_model()
