"""The rollout engine: sample candidates at a precision, score them, time every phase.

Methods talk to the model only through an ``Engine``. It owns the machinery a method must not:
seeded noise (solbench.engine.noise), the sampler loop (solbench.engine.sampling), the choice of network by role
and the precision that role runs at, decoding, reward scoring, the explore-copy sync and timing
(solbench.engine.timing). A method names the phase its work belongs to; the engine measures it and records
the images generated and the FLOPs spent.

Roles and precision: the networks live in a mapping by role ("policy", "old", "ema", "reference",
"explore") that is read on every call, so a role may be re-bound (or implemented lazily, e.g. the
reference as the policy with LoRA disabled) between calls. Role "explore" runs at precision
"explore" (the low-precision copy from solbench.quant); every other role at "full" (bf16 on GPUs,
fp32 on CPU). Each Rollout (solbench.engine.rollout, re-exported here) records the precision role and the dtype
actually used.

Noise: the initial noise of candidate (prompt id, index) is solbench.engine.noise.candidate_noise in stream
``stream``; the per-step noise of stochastic samplers is keyed by the candidate (not by its initial
noise, so DanceGRPO's group with one shared initial noise still gets independent SDE noise) in
stream ``<stream>/sde``. A candidate therefore comes out the same on any batch size, order or rank,
and a seed explored in FP4 regenerates exactly in full precision. (At full precision bit for bit on
CPU; an explore copy whose activations have a per-tensor scale, NVFP4's global amax as in TE, also
depends slightly on which candidates share its GEMM.)

Several ranks (solbench.engine.distributed): every rank makes the same ``sample`` call with the global list
of samples and computes its shard; latents and trajectories are gathered when method code reads them
(and only the rows it selected first: ``Rollout.index`` does not communicate), so every rank sees the
whole rollout; images stay where they were decoded (``Rollout.image_rows``) and ``score`` gathers
the rewards. Method code sees global rollouts and needs no change.

Memory: decoded images go to host memory chunk by chunk, as each rollout micro-batch is decoded,
into one preallocated buffer (a rank's 576 FLUX explore images at 1024 px are 7.3 GB of float32;
kept on the GPU, and concatenated at the end, they were that twice over). Rewards move each reward
micro-batch back to their device. Latents and trajectories stay on the device (training reads them),
written into preallocated buffers too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import torch
from torch import Tensor, nn

from solbench.engine import sampling
from solbench.models.batch_invariance import pad_linear_rows
from solbench.models.compile import sampling as compiled_sampling
from solbench.engine.distributed import SINGLE, DistContext, ShardedRows
from solbench.errors import ConfigError
from solbench.models.base import Cond, ModelAdapter, net_dtype
from solbench.engine.noise import candidate_noise, noise_seed, step_noise
from solbench.engine.rollout import Rollout, _positions
from solbench.engine.sampling import SamplerSpec, StepLogProb, Trajectory
from solbench.engine.timing import PhaseTimer

__all__ = ["Engine", "Rollout", "SamplerSpec", "StepLogProb", "Trajectory"]

EXPLORE_ROLE = "explore"


def precision_of(role: str) -> str:
    """The precision role a network role runs at."""
    return "explore" if role == EXPLORE_ROLE else "full"


class _RowBuffers:
    """The rows of one rank's rollout, filled micro-batch by micro-batch into tensors allocated once
    (at the first micro-batch, when shapes are known): no list of chunks and no concatenation, which
    held everything twice at the end. Images go to host memory."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.buffers: dict[str, Tensor] = {}

    def put(self, start: int, *, x0: Tensor, images: Tensor, trajectory: Trajectory | None) -> None:
        parts = {"x0": x0, "images": images}
        if trajectory is not None:
            parts.update(xs=trajectory.xs, log_probs=trajectory.log_probs, means=trajectory.means)
        for name, value in parts.items():
            if value is None:
                continue
            buffer = self.buffers.get(name)
            if buffer is None:
                device = torch.device("cpu") if name == "images" else value.device
                buffer = self.buffers[name] = value.new_empty((self.rows, *value.shape[1:]), device=device)
            buffer[start:start + value.shape[0]].copy_(value)

    def get(self, name: str, default: Tensor | None = None) -> Tensor | None:
        return self.buffers.get(name, default)


class Engine:
    """Samples, scores and times rollouts for one run.

    Args:
        adapter: the model (solbench.models.build_adapter).
        nets: networks by role; looked up on every call.
        rewards: a callable (images, prompts) -> (total [B], {name: [B]}) (solbench.rewards.RewardSet).
        timer: the run's PhaseTimer.
        run_seed: the run seed all noise derives from.
        device: where sampling runs.
        explore_recipe: the quantization recipe of the "explore" copy (a name or an object with
            ``.name``); recorded in the dtype label of explore rollouts.
        micro_batch: sample at most this many candidates per network call (memory bound on real
            models); None = the whole request at once.
        reward_micro_batch: score at most this many images per reward call (RunConfig.micro_batch.reward);
            None = all the images a rank holds at once.
        batch_multiple: every network call is padded (with copies of its last row, dropped after)
            to a multiple of this many rows; default 4 on CPU, 1 elsewhere.
        pad_rows: compute every linear layer on a row count CPU GEMMs are row-invariant for
            (solbench.models.batch_invariance); default on CPU unless ``nets`` runs compiled blocks. With the batch padding it makes a
            candidate's result on CPU bit-identical whatever batch, micro-batch or rank computes it.
        dist: this process's place among the run's ranks (solbench.engine.distributed); default one process.
    """

    def __init__(self, adapter: ModelAdapter, nets: Mapping[str, nn.Module], rewards, timer: PhaseTimer,
                 run_seed: int, device: torch.device | str = "cpu", explore_recipe=None,
                 micro_batch: int | None = None, batch_multiple: int | None = None,
                 pad_rows: bool | None = None, dist: DistContext = SINGLE,
                 reward_micro_batch: int | None = None) -> None:
        self.adapter = adapter
        self.nets = nets
        self.rewards = rewards
        self.timer = timer
        self.run_seed = int(run_seed)
        self.device = torch.device(device)
        self.explore_recipe = explore_recipe
        if micro_batch is not None and micro_batch < 1:
            raise ConfigError(f"Engine micro_batch must be >= 1, got {micro_batch}")
        self.micro_batch = micro_batch
        if reward_micro_batch is not None and reward_micro_batch < 1:
            raise ConfigError(f"Engine reward_micro_batch must be >= 1, got {reward_micro_batch}")
        self.reward_micro_batch = reward_micro_batch
        if batch_multiple is None:
            batch_multiple = 4 if self.device.type == "cpu" else 1
        if batch_multiple < 1:
            raise ConfigError(f"Engine batch_multiple must be >= 1, got {batch_multiple}")
        self.batch_multiple = batch_multiple
        # compiled blocks on CPU (model.compile on; a test mode) run unpadded: the row-padding hooks, new each call,
        # would recompile every call, and compiled kernels void the bit-identity the padding exists for
        self.pad_rows = (self.device.type == "cpu" and not getattr(nets, "compiled_blocks", 0)) \
            if pad_rows is None else bool(pad_rows)
        self.dist = dist
        self._recorded: list[Rollout] | None = None  # see ``recording``

    @contextmanager
    def recording(self) -> Iterator[list[Rollout]]:
        """Keep every rollout sampled inside the block, without its images, in the list it yields (the
        harness's explore-gap measurement finds the trained samples' seeds there: solbench.train.explore_gap).
        Nothing sampled changes; the rollouts' latents live until the list goes."""
        self._recorded = recorded = []
        try:
            yield recorded
        finally:
            self._recorded = None

    # -- networks and precision ----------------------------------------------------------------
    def net(self, role: str | nn.Module) -> nn.Module:
        """The network playing ``role`` now (a module is passed through)."""
        if isinstance(role, nn.Module):
            return role
        try:
            return self.nets[role]
        except KeyError:
            raise ConfigError(f"no network for role {role!r}; this run has roles {', '.join(self.nets)}") from None

    def dtype_label(self, role: str | nn.Module, module: nn.Module) -> str:
        """What a role actually computes in, as recorded in rollouts and timing rows."""
        dtype = str(net_dtype(module)).removeprefix("torch.")
        if role == EXPLORE_ROLE and self.explore_recipe is not None:
            recipe = getattr(self.explore_recipe, "name", self.explore_recipe)
            return f"{recipe}({dtype})"
        return dtype

    # -- phases ---------------------------------------------------------------------------------
    def phase(self, name: str, **kw):
        """Context manager timing the enclosed block as phase ``name`` (see solbench.engine.timing)."""
        return self.timer.phase(name, **kw)

    # -- model calls ----------------------------------------------------------------------------
    def encode(self, prompts: Sequence[str]) -> Cond:
        # padded like velocity, which encodes CFG's empty prompt itself: a cached text then holds
        # the same numbers whichever of the two encoded it first
        with self._row_invariant():
            return self.adapter.encode(prompts)

    def _row_invariant(self):
        """The context every network call runs in (see ``pad_rows``)."""
        return pad_linear_rows() if self.pad_rows else nullcontext()

    def velocity(self, net: str | nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None = None,
                 *, detach_uncond: bool = False) -> Tensor:
        """Velocity of a role (or module) at (x_t, t); carries gradients when the net has them
        (``detach_uncond``: not through CFG's unconditional branch, ModelAdapter.velocity).

        Computed exactly as during sampling (same padding), so a stored step recomputed with the
        rollout's network gives the rollout's velocity bit for bit. Its FLOPs count toward the
        phase open around the call (``count_velocity_flops``): the "train" phase gets its cost so.
        """
        v = self._velocity(self.net(net), x_t, t, cond, guidance, detach_uncond)
        self.count_velocity_flops(x_t.shape[0], guidance, backward=v.requires_grad)
        return v

    def count_velocity_flops(self, rows: int, guidance: float | None, *, backward: bool) -> None:
        """Add a velocity call's FLOPs to the open phase: forwards for ``rows`` samples on every rank
        and, when its output carries gradients, the backward pass the loss will run through it.

        The backward costs 1 forward with LoRA (gradients of the activations; the adapters' own weight
        gradients are a rounding error) and 2 with full fine-tuning (activations and weights), the usual
        rule of thumb. Counted where the call is made, since the backward happens in the trainer.
        """
        per_forward = self.adapter.flops_per_forward()
        if per_forward is None:
            return
        forwards = per_forward * rows * self.adapter.forwards_per_velocity(guidance) * self.dist.world_size
        if backward:
            forwards *= 2.0 if getattr(self.nets, "mode", "full") == "lora" else 3.0
        self.timer.add_flops(forwards)

    def _velocity(self, module: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None,
                  detach_uncond: bool = False) -> Tensor:
        n = x_t.shape[0]
        t = torch.as_tensor(t, dtype=torch.float32, device=x_t.device)
        if t.ndim == 0:
            t = t.expand(n)
        pad = (-n) % self.batch_multiple
        with self._row_invariant():
            if pad == 0 or n == 0:
                return self.adapter.velocity(module, x_t, t, cond, guidance, detach_uncond)
            last = [n - 1] * pad
            v = self.adapter.velocity(module, torch.cat([x_t, x_t[last]]), torch.cat([t, t[last]]),
                                      Cond.cat([cond, cond.index(last)]), guidance, detach_uncond)
        return v[:n]

    def rollout_flops(self, n_images: int, sampler: SamplerSpec) -> float | None:
        per_forward = self.adapter.flops_per_forward()
        if per_forward is None:
            return None
        return per_forward * n_images * sampler.steps * self.adapter.forwards_per_velocity(sampler.guidance)

    def sample(self, prompt_ids: Sequence[str], prompts: Sequence[str], cand_idx: Sequence[int], *,
               net: str | nn.Module = "policy", sampler: SamplerSpec, phase: str, stream: str,
               noise_idx: Sequence[int] | None = None, keep_trajectory: bool = False) -> Rollout:
        """Generate one image per (prompt_ids[i], prompts[i], cand_idx[i]) with ``net``.

        ``noise_idx`` (default cand_idx) picks the initial noise: DanceGRPO passes one value per
        group to share its initial noise. Timed as ``phase`` with the precision of ``net``.
        """
        prompt_ids, prompts, cand_idx = list(prompt_ids), list(prompts), [int(c) for c in cand_idx]
        noise_idx = cand_idx if noise_idx is None else [int(c) for c in noise_idx]
        if not (len(prompt_ids) == len(prompts) == len(cand_idx) == len(noise_idx)):
            raise ValueError(f"sample: prompt_ids ({len(prompt_ids)}), prompts ({len(prompts)}), cand_idx "
                             f"({len(cand_idx)}) and noise_idx ({len(noise_idx)}) must have one entry per sample")
        role = net if isinstance(net, str) else "custom"
        module = self.net(net)
        precision = precision_of(role)
        spec = sampler.resolved(guidance=self.adapter.default_guidance, shift=self.adapter.default_shift)
        if isinstance(net, str) and not spec.stochastic and hasattr(self.nets, "rollout_module"):
            module = self.nets.rollout_module(net)  # the merged rollout copy where the run keeps one
        n = len(prompts)
        mine = self.dist.shard(n)  # this rank's rows (all of them in a single process)
        with self.timer.phase(phase, precision=precision, n_images=n, flops=self.rollout_flops(n, spec)):
            latent_shape = self.adapter.latent_shape
            seeds = [noise_seed(self.run_seed, stream, p, c) for p, c in zip(prompt_ids, noise_idx)]
            x_init, _ = candidate_noise(self.run_seed, stream, prompt_ids[mine], noise_idx[mine], latent_shape,
                                        device=self.device)
            sde_seeds = ([noise_seed(self.run_seed, f"{stream}/sde", p, c)
                          for p, c in zip(prompt_ids[mine], cand_idx[mine])] if spec.stochastic else [])
            sigmas = self.adapter.sigmas(spec.steps, spec.shift)
            local_prompts = prompts[mine]
            n_local = len(local_prompts)
            chunk = self.micro_batch or max(n_local, 1)
            out = _RowBuffers(n_local)  # x0 and trajectory rows on the device, images in host memory
            with torch.no_grad(), compiled_sampling():  # compiled blocks run compiled here (solbench.models.compile)
                for start in range(0, n_local, chunk):
                    sl = slice(start, start + chunk)
                    cond = self.encode(local_prompts[sl])
                    chunk_seeds = sde_seeds[sl]
                    noise = ((lambda j, s=chunk_seeds: step_noise(s, j, latent_shape, device=self.device))
                             if spec.stochastic else None)
                    x0, trajectory = sampling.sample(
                        lambda x, t, c=cond: self._velocity(module, x, t, c, spec.guidance),
                        x_init[sl], sigmas, spec, noise=noise, keep_trajectory=keep_trajectory)
                    out.put(start, x0=x0, images=self.adapter.decode(x0), trajectory=trajectory)
                    del x0, trajectory
            x0 = out.get("x0", x_init[:0])
            images = out.get("images", x_init.new_zeros((0, 3, 1, 1), device="cpu"))
            trajectory = (Trajectory(out.get("xs"), sigmas.clone(), out.get("log_probs"), out.get("means"))
                          if keep_trajectory and n_local else None)
            image_rows = None
            if self.dist.enabled:
                x0 = ShardedRows.from_shards(self.dist, x0, n)  # gathered when (and as far as) it is read
                trajectory = self._sharded_trajectory(trajectory, n, keep_trajectory, sigmas)
                image_rows = list(range(mine.start, mine.stop))
        rollout = Rollout(prompt_ids=prompt_ids, prompts=prompts, cand_idx=cand_idx, noise_seeds=seeds,
                          precision=precision, dtype=self.dtype_label(role, module), x0=x0, images=images,
                          sampler=spec, net=role, stream=stream, trajectory=trajectory, image_rows=image_rows)
        if self._recorded is not None:
            self._recorded.append(replace(rollout, x0=rollout.__dict__["x0"], images=images[:0], trajectory=None,
                                          image_rows=None if image_rows is None else []))
        return rollout

    def _sharded_trajectory(self, local: Trajectory | None, n: int, keep: bool, sigmas: Tensor) -> Trajectory | None:
        """This rank's shard of a trajectory as the rows of the whole one, gathered when read."""
        if not keep:
            return None
        if local is None:  # this rank's shard was empty: take shapes from a stand-in of zero rows
            raise ValueError(f"sample: {n} samples over {self.dist.world_size} ranks leaves rank "
                             f"{self.dist.rank} without samples; request at least one sample per rank")

        def spread(t):
            return None if t is None else ShardedRows.from_shards(self.dist, t, n)

        return Trajectory(spread(local.xs), local.ts, spread(local.log_probs), spread(local.means))

    def score(self, rollout: Rollout, *, phase: str = "reward") -> Tensor:
        """Score the rollout's images with the run's rewards; fills rollout.rewards/reward_parts."""
        with self.timer.phase(phase, precision=rollout.precision, n_images=len(rollout)):
            total, parts = self.score_with(self.rewards, rollout)
        rollout.rewards = total
        rollout.reward_parts = dict(parts)
        return total

    def score_with(self, reward_fn, rollout: Rollout) -> tuple[Tensor, dict[str, Tensor]]:
        """(total [B], parts) of ``reward_fn`` on the rollout, which returns a tensor or (total, parts).

        Scores the images this rank holds; with several ranks the scores are gathered, so every rank
        returns the scores of all B samples in rollout order. Not timed (callers name the phase).
        """
        rows = list(range(len(rollout))) if rollout.image_rows is None else rollout.image_rows
        held_prompts = [rollout.prompts[i] for i in rows]
        total, parts = (self._score_chunks(reward_fn, rollout.images, held_prompts)
                        if rows or not self.dist.enabled else (None, {}))
        if not self.dist.enabled:
            return total, dict(parts)
        shards = self.dist.gather_objects((rows, None if total is None else total.detach().cpu(),
                                           {k: v.detach().cpu() for k, v in parts.items()}))
        n = len(rollout)
        full_total = torch.full((n,), float("nan"))
        full_parts: dict[str, Tensor] = {}
        covered = 0
        for shard_rows, shard_total, shard_parts in shards:
            if not shard_rows:
                continue
            index = torch.tensor(shard_rows, dtype=torch.long)
            full_total = full_total.to(shard_total.dtype)
            full_total[index] = shard_total
            for key, value in shard_parts.items():
                full_parts.setdefault(key, torch.full((n,), float("nan"), dtype=value.dtype))[index] = value
            covered += len(shard_rows)
        if covered != n:
            raise RuntimeError(f"score: the ranks hold images of {covered} of {n} samples; every sample must be "
                               "held by exactly one rank")
        return full_total, full_parts

    def _score_chunks(self, reward_fn, images: Tensor, prompts: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """``reward_fn`` over chunks of ``reward_micro_batch`` images, concatenated (total, parts)."""
        chunk = self.reward_micro_batch or max(len(prompts), 1)
        totals, parts_list = [], []
        for start in range(0, max(len(prompts), 1), chunk):
            total, parts = self._score_padded(reward_fn, images[start:start + chunk], prompts[start:start + chunk])
            totals.append(total)
            parts_list.append(parts)
        if len(totals) == 1:
            return totals[0], parts_list[0]
        names = set(parts_list[0])
        return (torch.cat(totals),
                {k: torch.cat([p[k] for p in parts_list]) for k in names if all(k in p for p in parts_list)})

    def _score_padded(self, reward_fn, images: Tensor, prompts: list[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """One reward call, padded like a network call (copies of the last image, dropped after): a
        reward model's score of an image must not depend on the images scored beside it (on CPU a
        convolution over one image takes another kernel than over several)."""
        n = len(prompts)
        pad = (-n) % self.batch_multiple if n else 0
        if pad:
            images = torch.cat([images, images[[n - 1] * pad]])
            prompts = prompts + [prompts[-1]] * pad
        with self._row_invariant():
            out = reward_fn(images, prompts)
        total, parts = out if isinstance(out, tuple) else (out, {})
        if not pad:
            return total, dict(parts)
        return total[:n], {k: v[:n] for k, v in parts.items()}

    def log_prob(self, net: str | nn.Module, rollout: Rollout, step_index: int,
                 idx: Sequence[int] | Tensor | None = None) -> StepLogProb:
        """Log-prob, mean and std of the stored transition ``step_index`` of ``rollout`` under ``net``.

        Recomputes the velocity with the rollout's guidance and schedule, so that with the rollout's
        own network (and the same samples ``idx``, default all) it equals the rollout's log-prob
        exactly. Gradients flow when ``net`` has them.
        """
        trajectory = rollout.trajectory
        if trajectory is None:
            raise ValueError("log_prob needs a rollout sampled with keep_trajectory=True")
        if not rollout.sampler.stochastic:
            raise ValueError(f"log_prob: sampler {rollout.sampler.kind} is deterministic and has no transition density")
        steps = trajectory.ts.shape[0] - 1
        if not 0 <= step_index < steps:
            raise IndexError(f"step_index {step_index} out of range for a {steps}-step trajectory")
        xs, prompts = trajectory.xs, rollout.prompts
        if idx is not None:
            pos = _positions(idx)
            xs, prompts = xs[pos.to(xs.device)], [prompts[i] for i in pos.tolist()]
        x, x_next = xs[:, step_index], xs[:, step_index + 1]
        t = trajectory.ts[step_index].to(x.device).expand(x.shape[0])
        v = self.velocity(net, x, t, self.encode(prompts), rollout.sampler.guidance)
        return sampling.step_log_prob(rollout.sampler.kind, x, v, trajectory.ts, step_index, x_next,
                                      rollout.sampler.noise_level)

    def sync_explore_copy(self) -> None:
        """Refresh the explore copy from the policy's current weights (phase "sync")."""
        with self.timer.phase("sync", precision="explore"):
            sync = getattr(self.nets, "sync_explore_copy", None)
            if callable(sync):
                sync()
                return
            from solbench.quant import sync_weights

            sync_weights(self.net(EXPLORE_ROLE), self.net("policy"))
