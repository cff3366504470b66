"""Which network a run's full-precision rollouts sample through: ``model.rollout_copy`` resolved here.

- ``merged``: a copy of the method's rollout role with its LoRA adapter merged, refreshed after every
  update (solbench.engine.policy.PolicyNets: the reference's inference copy; its refresh is timed as "sync").
- ``lora``: the shared transformer with the role's adapter active (peft's unmerged LoRA).
- ``auto``: on a CUDA GPU, ``merged`` where the memory model the doctor also reports (solbench.models.memory:
  memory_items with the copy's item) says the run fits the GPU, ``lora`` where it does not; on CPU ``lora``, which keeps
  the embedded world's numbers (its results were made through the LoRA role, and a merged copy samples
  only 1.03-1.07x faster there: benchmarks/lora_rollout.py).

Full fine-tuning has no adapters: every role is a plain transformer already ("full"). The choice and
its reason are recorded with the run (``RolloutCopyChoice.record``, rollout.json).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solbench.config import RunConfig

__all__ = ["RolloutCopyChoice", "choose_rollout_copy"]


@dataclass(frozen=True)
class RolloutCopyChoice:
    requested: str
    path: str  # merged | lora | full
    reason: str

    def record(self) -> dict:
        return {"rollout_copy_requested": self.requested, "rollout_copy": self.path, "reason": self.reason}


def choose_rollout_copy(cfg: RunConfig, device: torch.device | str,
                        capacity_gb: float | None = None) -> RolloutCopyChoice:
    """Resolve ``cfg.model.rollout_copy`` for a run on ``device``. ``capacity_gb`` stands for the GPU's
    memory (GB; default: the device's own), as the doctor's B200/H100 columns do."""
    from solbench.models import check_model_settings

    check_model_settings(cfg.model)  # model.rollout_copy and model.compile among them
    requested = cfg.model.rollout_copy
    if cfg.finetune.mode == "full":
        return RolloutCopyChoice(requested, "full", "full fine-tuning: every role is a plain transformer")
    if requested != "auto":
        return RolloutCopyChoice(requested, requested, "as set")
    device = torch.device(device)
    if device.type != "cuda":
        return RolloutCopyChoice(requested, "lora", "auto takes the LoRA path off CUDA (the embedded world's "
                                                    "results were made with it)")
    from solbench.method import get_method
    from solbench.models.memory import MemoryProfile, merged_copy_fits, run_memory_profile

    explores = "explore" in get_method(cfg.method).nets
    profile: MemoryProfile | None = run_memory_profile(cfg.to_dict(), explore=explores)
    if profile is None:
        return RolloutCopyChoice(requested, "merged", f"the doctor's memory model has no {cfg.model.name} row "
                                                      "(a small model): the copy fits")
    if capacity_gb is None:
        capacity_gb = torch.cuda.get_device_properties(device).total_memory / 1e9
    fits, need_gb = merged_copy_fits(profile, capacity_gb)
    verdict = "fits" if fits else "does not fit"
    return RolloutCopyChoice(requested, "merged" if fits else "lora",
                             f"the doctor's estimate with a merged copy, {need_gb:.1f} GB per rank, {verdict} "
                             f"this GPU's {capacity_gb:.0f} GB")
