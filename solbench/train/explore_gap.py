"""The explore copy's error where the paper says it matters (issue 48): on the samples a run trains on and on
their training gradient, measured by the harness beside the training of every method with an explore copy.

At a measured iteration (``eval.explore_gap_every``: iteration 1, every that many iterations and the last; 0, the
default, measures nothing) the seeds the method trained on are sampled at the other precision as well, with the
same sampler, prompts and initial noise (solbench.engine.noise: a pure function of run seed, stream, prompt and candidate):

- naive FP4 trains on its explore-copy samples: their full-precision twins are sampled through the method's
  rollout role (the same role the explore copy mirrors, so the pair differs only by the quantization);
- Sol-RL trains on its full-precision regenerations: their explore-copy twins are sampled with the full step budget
  (its own explore samples took fewer steps, so they would mix step error into the precision error).

Rows (metrics table, split ``explore_gap``; ``low`` the explore copy's sample, ``full`` its full-precision twin):

- ``x0_rel_dist``: mean over the measured samples of RMS(x0_low - x0_full) / s, with s the spread of the full-precision
  samples, sqrt(mean over latent coordinates of their variance across the measured samples): 0 when the explore
  copy changes nothing, about sqrt(2) when its sample is as far from its twin as two seeds are from each other;
- ``x0_rms``: the mean RMS(x0_low - x0_full) itself, in latent units;
- ``grad_cos``, ``grad_norm_ratio`` (|g_low| / |g_full|), ``grad_rel_dist`` (|g_low - g_full| / |g_full|): the
  gradient g of the method's loss over the iteration's batch (every chunk, each micro-batch's mean loss, averaged
  over micro-batches: one full-batch gradient, not the clipped updates) with respect to the trained parameters at
  the policy of this iteration, once on the ``low`` samples and once on their ``full`` twins; the same advantages,
  timesteps and loss noise for both (a generator of its own, from run seed and step), so the two differ only by the
  samples;
- ``n_samples``: how many samples were measured.

What it must not do: change the run. The twins are never trained on; the iteration's generator, the global RNG
state and the parameters' ``.grad`` are left as they were (tests/test_dose_response.py: a run's training rows,
candidates and weights are bit-identical with and without the measurement); its sampling is not timed (the
timer's records of it are dropped, so the timings table and Table 5 do not see it) and the trainer takes its
duration out of the iteration's wall clock; its images are not counted in images_seen.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from contextlib import contextmanager

import torch

from solbench.method import Batch, Iteration, Method
from solbench.engine.rollout import Rollout

SPLIT = "explore_gap"
METRICS = ("x0_rel_dist", "x0_rms", "grad_cos", "grad_norm_ratio", "grad_rel_dist", "n_samples")


def due(step: int, every: int, iterations: int) -> bool:
    """Whether iteration ``step`` (1-based) of a run of ``iterations`` is measured at ``every`` (0: never)."""
    return every > 0 and (step == 1 or step % every == 0 or step == iterations)


def sample_distance(low: torch.Tensor, full: torch.Tensor) -> dict[str, float]:
    """``x0_rel_dist`` and ``x0_rms`` of paired samples [B, ...] (see the module docstring)."""
    low, full = low.detach().flatten(1).double().cpu(), full.detach().flatten(1).double().cpu()
    rms = (low - full).pow(2).mean(dim=1).sqrt()
    spread = float(full.var(dim=0, correction=0).mean().sqrt()) if full.shape[0] > 1 else 0.0
    return {"x0_rel_dist": float(rms.mean()) / spread if spread > 0 else math.nan, "x0_rms": float(rms.mean())}


def gradient_distance(g_low: torch.Tensor, g_full: torch.Tensor) -> dict[str, float]:
    """``grad_cos``, ``grad_norm_ratio`` and ``grad_rel_dist`` of two flat gradients."""
    g_low, g_full = g_low.double(), g_full.double()
    n_low, n_full = float(g_low.norm()), float(g_full.norm())
    if n_full == 0:
        return {"grad_cos": math.nan, "grad_norm_ratio": math.nan, "grad_rel_dist": math.nan}
    cos = float(g_low @ g_full) / (n_low * n_full) if n_low > 0 else math.nan
    return {"grad_cos": cos, "grad_norm_ratio": n_low / n_full, "grad_rel_dist": float((g_low - g_full).norm()) / n_full}


def batch_gradient(method: Method, engine, batch: Batch, it: Iteration, params: Sequence[torch.Tensor]) -> torch.Tensor:
    """The flat gradient of the method's loss over ``batch`` (every chunk; micro-batch means averaged), by
    torch.autograd.grad: the parameters' ``.grad`` stay untouched."""
    total = [torch.zeros_like(p) for p in params]
    for chunk in method.chunks(batch, it):
        loss, _ = method.loss(engine, chunk)
        grads = torch.autograd.grad(loss * (chunk.weight / chunk.n_micro_batches), params, allow_unused=True)
        for acc, g in zip(total, grads):
            if g is not None:
                acc.add_(g)
    return torch.cat([g.flatten().double() for g in total])


def trained_source(trained_x0: torch.Tensor, recorded: Sequence[Rollout]) -> tuple[Rollout, list[int]]:
    """The recorded rollout the trained samples were taken from and their rows in it, in training order, found by
    their latents (bit for bit: a method trains on rows of what the engine returned)."""
    wanted = trained_x0.detach().float().cpu()
    for rollout in recorded:
        x0 = rollout.x0
        if x0 is None or x0.shape[1:] != wanted.shape[1:]:
            continue
        rows = {bytes(row.numpy().tobytes()): i for i, row in enumerate(x0.detach().float().cpu())}
        found = [rows.get(bytes(row.numpy().tobytes())) for row in wanted]
        if all(i is not None for i in found):
            return rollout, found
    raise RuntimeError(f"explore gap: the {len(wanted)} trained samples are not rows of any of the "
                       f"{len(recorded)} rollouts the iteration sampled; the measurement needs a method whose "
                       "batch trains on what the engine returned")


@contextmanager
def untimed(timer):
    """Drop the timer's records of the enclosed block (and with them the FLOPs its phases counted)."""
    kept = len(timer.records)
    try:
        yield
    finally:
        del timer.records[kept:]


def measure(method: Method, engine, batch: Batch, recorded: Sequence[Rollout], *, step: int, generator: torch.Generator,
            params: Sequence[torch.Tensor], rollout_role: str) -> dict[str, float]:
    """The explore gap of one iteration's batch (module docstring); ``recorded``: the rollouts of its collect
    (Engine.recording), ``generator``: the measurement's own (never the iteration's), ``rollout_role``: the role the
    explore copy mirrors. Empty when the method's batch holds no trained latents (``data["x0"]``)."""
    trained_x0 = batch.data.get("x0")
    if not isinstance(trained_x0, torch.Tensor):
        return {}
    trained, rows = trained_source(trained_x0, recorded)
    ids, prompts, cand = ([getattr(trained, name)[i] for i in rows] for name in ("prompt_ids", "prompts", "cand_idx"))
    other_role = "explore" if trained.precision == "full" else rollout_role
    state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        with untimed(engine.timer):
            twin = engine.sample(ids, prompts, cand, net=other_role, sampler=trained.sampler,
                                 phase="explore" if other_role == "explore" else "regenerate", stream=trained.stream)
            if twin.noise_seeds != [trained.noise_seeds[i] for i in rows]:
                raise RuntimeError("explore gap: the twins' initial noise differs from the trained samples' (a method "
                                   "that draws noise by another index than its candidate index)")
            twin_x0 = twin.x0.to(trained_x0.device, trained_x0.dtype)
            other = dataclasses.replace(batch, data={**batch.data, "x0": twin_x0})
            start = generator.get_state()
            g_trained = batch_gradient(method, engine, batch, Iteration(step, trained.stream, generator), params)
            generator.set_state(start)
            g_twin = batch_gradient(method, engine, other, Iteration(step, trained.stream, generator), params)
    finally:
        torch.random.set_rng_state(state)
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
    low, full = (twin_x0, trained_x0) if trained.precision == "full" else (trained_x0, twin_x0)
    g_low, g_full = (g_twin, g_trained) if trained.precision == "full" else (g_trained, g_twin)
    return {**sample_distance(low, full), **gradient_distance(g_low, g_full), "n_samples": float(len(rows))}
