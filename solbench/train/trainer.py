"""One training run: build everything from a RunConfig, iterate, evaluate, checkpoint, record.

``train_run(cfg, store)`` is what the launcher calls. It builds the model adapter, the rewards, the
networks by role (PolicyNets), the engine and the method, then runs ``cfg.iterations`` iterations::

    prompts  <- drawn from the train set by (seed, step): identical for every method
    batch    <- method.collect(engine, prompts, it)              engine phases: explore/select/regenerate/rollout/reward
    a NaN/inf reward -> NonFiniteLossError (before anything trains on it)
    explore gap (eval.explore_gap_every; runs with an explore copy): the trained seeds sampled at the other
        precision, sample and loss-gradient distances (solbench.train.explore_gap); untimed, out of wall_s, training untouched
    for chunk in method.chunks(batch, it):                       phase "train"
        loss <- method.loss(engine, chunk); NaN/inf -> NonFiniteLossError
        backward(loss * chunk.weight / micro-batches per step)
        after every grad_accum micro-batches (and the last), or finetune.optimizer_steps times per
        iteration (micro-batches split evenly): clip, AdamW step, weights check (non-finite or
        |w| > WEIGHT_LIMIT -> NonFiniteLossError, so the last checkpoint is a finite one), EMA step
        (every finetune.ema_every optimizer steps)
    method.after_update(nets, step)                              e.g. the old-policy EMA
    engine.sync_explore_copy()                                   phase "sync" (an explore or merged rollout copy)

A NonFiniteLossError names the step and the run; so does a quantizer NaN error from the explore
copy (sampling or sync), re-raised as one.

Evaluation runs at step 0 (the base model), every ``cfg.eval.every`` iterations and at the end: the
EMA weights (or the policy) sample the fixed eval prompts x seeds (noise stream "eval") with the
run's evaluation protocol (``eval_sampler``: eval.sampler, an Euler ODE by default, of ``eval_steps`` steps at
eval.guidance and eval.shift; ``eval_resolution``: eval.resolution px; each unset takes the training
setting), scored by ``cfg.eval.rewards``. The real specs state one protocol per model, the same for
every method (solbench.provenance checks it).

Rows go to the run's tables (metrics, timings, candidates) after every iteration, TensorBoard
scalars to run_dir/tb and a sample grid per evaluation to run_dir/samples.

With ``world_size`` > 1 every rank runs this same loop (solbench.engine.distributed): the engine shards
rollouts and gathers latents and rewards, so every rank collects the same global batch; the chunks
are dealt round-robin over ranks and gradients summed before each optimizer step. Rank 0 alone
writes rows, checkpoints, TensorBoard and grids; every rank resumes from rank 0's checkpoint. A checkpoint holds
everything needed to continue bit for bit: trainable weights of every role, optimizer, method
state, RNG states, step, wall-clock and images seen. On start, the newest checkpoint is loaded and
rows after its step are dropped first, so a resumed run neither loses nor duplicates rows.

This module is one class and its entry point (over 500 lines for that reason): ``Trainer`` is the
training loop, whose methods share one run's state (step, optimizer, engine, store); the set-up it
builds a run from and the pure helpers of its schedule are in solbench.train.setup, re-exported
here, and the measurements it hosts without owning them are modules of their own (the explore gap,
solbench.train.explore_gap; this CPU's rates, solbench.train.cpu_rates; checkpoint contents, solbench.results.checkpoint):
the class keeps only the call and the record.

One module of about 530 lines, on purpose: ``Trainer``'s steps (iterate, optimize, evaluate, record, checkpoint)
all read and write the same run state (networks, optimizer, engine, store, step), and what is not that state lives
beside it already (train/setup.py builds it; facts.py, cpu_rates.py, explore_gap.py, rollout_copy.py). The seam
left is evaluation and its sample grids (``evaluate``, ``_save_grid``), the next to move (train/evaluate.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from solbench.train import explore_gap
from solbench.config import RunConfig
from solbench.engine.distributed import DistContext, init_distributed
from solbench.engine.engine import Engine
from solbench.errors import ConfigError, NonFiniteLossError
from solbench.method import Batch, Chunk, Iteration, Method, RunInfo, get_method, method_settings
from solbench.results.checkpoint import missing_keys, rng_state, set_rng_state
from solbench.engine.timing import PhaseTimer
from solbench.train.setup import (ExploreFns, FollowerStore, _lookahead, _seed_everything, _seeded_generator,
                                    build_policy_nets, eval_resolution, eval_sampler, grid_prompt_indices,
                                    quant_explore_fns, resolve_device, step_group)

__all__ = ["WEIGHT_LIMIT", "ExploreFns", "FollowerStore", "Trainer", "build_policy_nets", "eval_resolution",
           "eval_sampler", "grid_prompt_indices", "quant_explore_fns", "resolve_device", "step_group", "train_run"]

log = logging.getLogger(__name__)


# Largest |weight| a trained parameter may reach. AdamW moves a weight by about lr per step (its
# update m / sqrt(v) is of order 1), so from O(1) weights (LoRA, pretrained transformers) no sane
# run comes near 1e6; past it the run has diverged (16-bit activations, max 65504 in fp16, overflow
# long before 1e30), and a finite but diverged checkpoint would pass for the last good one.
WEIGHT_LIMIT = 1e6


def train_run(cfg: RunConfig, store, *, progress=None) -> dict:
    """Run (or resume) one training run; returns a summary dict (final eval metrics, step, wall_s).

    With ``cfg.world_size`` > 1 this process must be one of that many ranks (torchrun or Slurm
    tasks); see solbench.engine.distributed.
    """
    dist = init_distributed(cfg.world_size, resolve_device(cfg.device).type)
    try:
        result = Trainer(cfg, store, progress=progress, dist=dist).run()
    except BaseException:
        dist.close(synchronize=False)
        raise
    dist.close()
    return result


class Trainer:
    """The state of one run; ``run()`` drives it. ``explore`` overrides the explore-copy functions
    (tests use an identity copy to check Sol-RL's invariants); ``adapter`` and ``reward_models``
    (name -> reward) replace loading the model and rewards from their weights (solbench.measure
    builds them at their published shapes with random weights)."""

    def __init__(self, cfg: RunConfig, store, *, progress=None, explore: ExploreFns | None = None,
                 dist: DistContext | None = None, adapter=None, reward_models: dict | None = None) -> None:
        from solbench.models import build_adapter
        from solbench import rewards as reward_registry
        from solbench.world.prompts import load_prompt_set

        for name, value in (("eval.every", cfg.eval.every), ("checkpoint_every", cfg.checkpoint_every),
                            ("iterations", cfg.iterations), ("prompts_per_iter", cfg.prompts_per_iter)):
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if cfg.eval.explore_gap_every < 0:
            raise ConfigError(f"eval.explore_gap_every must be >= 0 (0: not measured), got {cfg.eval.explore_gap_every}")
        if cfg.finetune.optimizer_steps is not None and (cfg.finetune.optimizer_steps < 1 or cfg.finetune.grad_accum != 1):
            raise ConfigError(f"finetune.optimizer_steps={cfg.finetune.optimizer_steps} must be >= 1 and needs "
                              f"finetune.grad_accum 1 (got {cfg.finetune.grad_accum})")
        self.cfg = cfg
        self.dist = dist or init_distributed(cfg.world_size, resolve_device(cfg.device).type)
        self.store = store if self.dist.is_main else FollowerStore(store)
        self.progress = progress if self.dist.is_main else None
        self.device = resolve_device(cfg.device)
        if self.dist.enabled and self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        _seed_everything(cfg.seed)  # LoRA's initial A matrices come from the global RNG

        method_cls = get_method(cfg.method)
        from solbench.models import resolve_micro_batches

        # micro-batches: the model's defaults where unset; micro_batch.train is the method's micro_batch_size
        self.micro_batch = resolve_micro_batches(cfg.model.name, dataclasses.asdict(cfg.micro_batch),
                                                 cfg.method_config.get("micro_batch_size"))
        # the method's typed Config: the one expansion built (a MethodSettings), or built once from spec.json's mapping
        settings = method_settings(cfg.method, cfg.method_config)
        if "micro_batch_size" in settings:
            settings = settings.replace(micro_batch_size=self.micro_batch["train"])
        self.method: Method = method_cls(settings.config, RunInfo(
            prompts_per_iter=cfg.prompts_per_iter, steps=cfg.sampling.steps, shift=cfg.sampling.shift,
            guidance=cfg.sampling.guidance, finetune_mode=cfg.finetune.mode, world_size=cfg.world_size))

        self.adapter = build_adapter(cfg.model, self.device) if adapter is None else adapter
        uses_explore = "explore" in method_cls.nets
        self.nets = build_policy_nets(cfg, self.adapter, method_cls.nets, explore_source=method_cls.rollout_net,
                                      explore=explore)
        if getattr(self.nets, "explore_backend", None) is not None:  # which backend quant.backend resolved to, and why
            log.info("%s", self.nets.explore_backend.describe())
            self.store.write_json("explore.json", self.nets.explore_backend.record())
        from solbench.train.facts import FACTS_FILE, run_facts

        # what a report needs from code, fixed now (solbench.results.stored_facts): collect reads it, not this code later
        if self.dist.is_main:
            self.store.write_json(FACTS_FILE, run_facts(cfg.to_dict(), explores=uses_explore))
        if getattr(self.nets, "rollout_record", None) is not None:  # rollout path and compilation (issue 40)
            self.store.write_json("rollout.json", self.nets.rollout_record)
            # rewritten when compiled sampling falls back to eager (its compile_fallback, solbench.models.compile)
            self.nets.rollout_record_changed = lambda: self.store.write_json("rollout.json", self.nets.rollout_record)
        self.timer = PhaseTimer()
        # One instance per reward name, shared by the training sum and evaluation (one copy of each
        # reward model per rank), loaded now: missing weights stop the run at launch, not at step 0's eval.
        given = reward_models or {}
        self.reward_models = {name: given[name] if name in given else reward_registry.get(name, self.device)
                              for name in dict.fromkeys([*cfg.rewards, *cfg.eval.rewards])}
        for reward in self.reward_models.values():
            if self.micro_batch["reward"] and isinstance(getattr(reward, "batch_size", None), int):
                reward.batch_size = self.micro_batch["reward"]  # the model rewards' own chunking
            if callable(getattr(reward, "load", None)):
                reward.load()
        self.engine = Engine(self.adapter, self.nets,
                             reward_registry.RewardSet(cfg.rewards, self.device, rewards=self.reward_models),
                             self.timer, cfg.seed, self.device,
                             explore_recipe=(cfg.quant.recipe if explore is None else "identity") if uses_explore else None,
                             micro_batch=self.micro_batch["rollout"], reward_micro_batch=self.micro_batch["reward"],
                             dist=self.dist)
        self.params = self.nets.trainable("policy")
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.finetune.lr, betas=tuple(cfg.finetune.adam_betas),
                                           weight_decay=cfg.finetune.weight_decay)

        self.train_prompts = load_prompt_set(cfg.train_prompts)
        if cfg.prompts_per_iter > len(self.train_prompts):
            raise ConfigError(f"prompts_per_iter={cfg.prompts_per_iter} exceeds the {len(self.train_prompts)} "
                              f"prompts of {cfg.train_prompts!r}")
        eval_prompts = load_prompt_set(cfg.eval.prompts)
        if cfg.eval.n_prompts and cfg.eval.n_prompts > len(eval_prompts):  # never silently fewer
            raise ConfigError(f"eval.n_prompts={cfg.eval.n_prompts} exceeds the {len(eval_prompts)} prompts of "
                              f"{cfg.eval.prompts!r}")
        self.eval_prompts = eval_prompts[: cfg.eval.n_prompts] if cfg.eval.n_prompts else eval_prompts
        self.eval_rewards = {name: self.reward_models[name] for name in cfg.eval.rewards}

        self.step = 0
        self.wall_s = 0.0
        self.images_seen = 0
        self.optimizer_steps = 0  # over the run: the evaluation EMA's schedule and warm-up count them
        self._writer = None

    # -- the run ------------------------------------------------------------------------------------
    def run(self) -> dict:
        cfg = self.cfg
        resumed = self.store.latest_checkpoint(lambda state: missing_keys(state, self.CHECKPOINT_KEYS))
        if resumed is not None:
            step, state = resumed
            self.store.truncate_after(step)
            self.load_state_dict(state)
            log.info("%s: resumed from the checkpoint of step %d", self.store.run_id, step)
        else:
            self.store.truncate_after(-1)
            self.evaluate()  # step 0: the base model
        self._record_cpu_rates()
        # a run resumed at its last step (killed after its final checkpoint) evaluates nothing more:
        # its final eval is the one already in the table
        final_eval: dict[str, float] = {}
        if self.step == cfg.iterations:
            final_eval = {row["metric"]: row["value"] for row in self.store.read("metrics")
                          if row["split"] == "eval" and row["step"] == self.step}
        while self.step < cfg.iterations:
            self.step += 1
            self.train_iteration()
            if self.step % cfg.eval.every == 0 or self.step == cfg.iterations:
                final_eval = self.evaluate()
            if (self.step % cfg.checkpoint_every == 0 or self.step == cfg.iterations) and self.dist.is_main:
                self.store.save_checkpoint(self.step, self.state_dict())
        if self._writer is not None:
            self._writer.close()
        return {"step": self.step, "wall_s": self.wall_s, "images_seen": self.images_seen, "eval": final_eval}

    def _record_cpu_rates(self) -> None:
        """On CPU, for a method with an explore copy: this CPU's GEMM and forward rates at the run's shapes, in
        cpu_rates.json (solbench.train.cpu_rates; the report predicts Table 5 from them). Private random inputs: the
        run's numbers do not depend on it."""
        cls = type(self.method)
        if self.device.type != "cpu" or "explore" not in cls.nets or not self.dist.is_main \
                or self.step >= self.cfg.iterations:
            return
        from solbench.train.cpu_rates import cached_cpu_rates

        n = getattr(self.method.config, "n", None) or 1
        batch = self.micro_batch["rollout"] or self.cfg.prompts_per_iter * n
        key = (self.cfg.model.name, self.cfg.model.path, self.cfg.quant.recipe, self.cfg.quant.backend, batch)
        self.store.write_json("cpu_rates.json", cached_cpu_rates(key, self.engine, cls.rollout_net, batch))

    def draw_prompts(self, step: int) -> list:
        """The prompt groups of iteration ``step``: a pure function of (run seed, step)."""
        order = torch.randperm(len(self.train_prompts), generator=_seeded_generator(self.cfg.seed, "prompts", step))
        return [self.train_prompts[i] for i in order[: self.cfg.prompts_per_iter].tolist()]

    def train_iteration(self) -> None:
        step = self.step
        self.timer.step = step
        start = time.perf_counter()
        records = self.draw_prompts(step)
        it = Iteration(step=step, stream=f"train/{step}", generator=_seeded_generator(self.cfg.seed, "method", step))
        measured = "explore" in self.nets and explore_gap.due(step, self.cfg.eval.explore_gap_every, self.cfg.iterations)
        with self._name_nonfinite("sampling or scoring the training batch"), \
                (self.engine.recording() if measured else contextlib.nullcontext()) as recorded:
            batch = self.method.collect(self.engine, [r.id for r in records], [r.text for r in records], it)
        self.check_rewards(batch)
        gap: dict[str, float] = {}
        if measured:  # not part of the iteration: untimed, and its duration is taken out of the wall clock
            paused = time.perf_counter()
            with self._name_nonfinite("measuring the explore gap"):
                gap = explore_gap.measure(self.method, self.engine, batch, recorded, step=step,
                                          generator=_seeded_generator(self.cfg.seed, "explore_gap", step),
                                          params=self.params, rollout_role=self.method.rollout_net)
            del recorded
            start += time.perf_counter() - paused
        with self.engine.phase("train", precision="full"):
            stats = self.optimize(batch, it)
        self.method.after_update(self.nets, step)
        if "explore" in self.nets or getattr(self.nets, "rollout_copy", None) is not None:
            with self._name_nonfinite("syncing the explore copy"):
                self.engine.sync_explore_copy()
        self.wall_s += time.perf_counter() - start
        self.images_seen += batch.n_images
        self.record_iteration(batch, stats, gap)

    def check_rewards(self, batch: Batch) -> None:
        """A NaN reward would rank first in selection and poison the advantages: stop instead."""
        bad = [c for c in batch.candidates if not math.isfinite(c.reward)]
        if bad:
            first = bad[0]
            raise NonFiniteLossError(
                f"{self.cfg.method}: {len(bad)} of {len(batch.candidates)} candidates have a non-finite reward at "
                f"step {self.step} (run {self.store.run_id}), first: prompt {first.prompt_id}, candidate "
                f"{first.cand_idx}, {first.precision} precision, reward {first.reward} (rewards: "
                f"{', '.join(self.cfg.rewards)}); stopping before training on it")

    @contextlib.contextmanager
    def _name_nonfinite(self, doing: str) -> Iterator[None]:
        """The quantizer's NaN/inf error (e.g. from the explore copy) with the step and run it happened in."""
        from solbench.quant.formats import NonFiniteError

        try:
            yield
        except NonFiniteError as err:
            raise NonFiniteLossError(f"{self.cfg.method}: non-finite values while {doing} at step {self.step} "
                                     f"(run {self.store.run_id}): {err}") from err

    def optimize(self, batch: Batch, it: Iteration) -> dict[str, float]:
        """Backward over the method's chunks with accumulation; optimizer and EMA steps; NaN checks.

        Chunk i is computed by rank i % world_size (every chunk here in a single process); the
        logs of all chunks are gathered and reduced in chunk order, as one process would. W ranks
        with grad_accum g update exactly like one process with grad_accum W x g.
        """
        dist = self.dist
        # grad_accum counts micro-batches per rank (as in the reference scripts): an optimizer step
        # follows grad_accum x world_size micro-batches of the global batch
        accum = max(1, int(self.cfg.finetune.grad_accum)) * dist.world_size
        steps_per_iter = self.cfg.finetune.optimizer_steps  # or: split the micro-batches into this many steps
        self.optimizer.zero_grad(set_to_none=True)
        computed: list[tuple[int, int, float, dict[str, float]]] = []  # (chunk, micro-batch, loss x weight, logs)
        grad_norms: list[float] = []
        error: str | None = None  # a non-finite loss; raised at the next optimizer step on every rank
        done = 0
        for index, (chunk, upcoming) in enumerate(_lookahead(iter(self.method.chunks(batch, it)))):
            if index % dist.world_size == dist.rank and error is None:
                loss, chunk_logs = self.method.loss(self.engine, chunk)
                if torch.isfinite(loss).all():
                    if steps_per_iter:
                        per_step = len(step_group(chunk.micro_batch, chunk.n_micro_batches, steps_per_iter))
                    else:
                        group_start = (chunk.micro_batch // accum) * accum
                        per_step = min(accum, chunk.n_micro_batches - group_start)
                    (loss * (chunk.weight / per_step)).backward()
                    computed.append((index, chunk.micro_batch, float(loss.detach()) * chunk.weight, chunk_logs))
                else:
                    error = (f"{self.cfg.method}: loss is {float(loss.detach())} at step {self.step}, micro-batch "
                             f"{chunk.micro_batch} of {chunk.n_micro_batches} (run {self.store.run_id}"
                             f"{f', rank {dist.rank}' if dist.enabled else ''}); stopping instead of zeroing it")
            if upcoming is not None and upcoming.micro_batch == chunk.micro_batch:
                continue
            done += 1
            if upcoming is not None:
                if steps_per_iter:
                    if upcoming.micro_batch in step_group(chunk.micro_batch, chunk.n_micro_batches, steps_per_iter):
                        continue
                elif done % accum:
                    continue
            grad_norms.append(self.optimizer_step(chunk, error))
        if dist.enabled:
            computed = sorted((c for part in dist.gather_objects(computed) for c in part), key=lambda c: c[0])
        logs: dict[str, list[float]] = defaultdict(list)
        micro_losses: dict[int, float] = {}
        for _, micro_batch, weighted_loss, chunk_logs in computed:
            micro_losses[micro_batch] = micro_losses.get(micro_batch, 0.0) + weighted_loss
            for key, value in chunk_logs.items():
                logs[key].append(value)
        stats = {key: float(np.mean(values)) for key, values in logs.items()}
        stats["loss"] = float(np.mean(list(micro_losses.values()))) if micro_losses else math.nan
        stats["grad_norm"] = float(np.mean(grad_norms)) if grad_norms else math.nan
        stats["optimizer_steps"] = float(len(grad_norms))
        stats["lr"] = float(self.optimizer.param_groups[0]["lr"])
        return stats

    def optimizer_step(self, chunk: Chunk, error: str | None = None) -> float:
        if self.dist.any(error is not None):
            raise NonFiniteLossError(error or f"{self.cfg.method}: a non-finite loss on another rank at step "
                                              f"{self.step} (run {self.store.run_id}); stopping")
        self.dist.sum_gradients(self.params)
        clip = self.cfg.finetune.grad_clip
        norm = torch.nn.utils.clip_grad_norm_(self.params, clip if clip and clip > 0 else math.inf)
        if not torch.isfinite(norm):
            raise NonFiniteLossError(
                f"{self.cfg.method}: gradient norm is {float(norm)} at step {self.step}, after micro-batch "
                f"{chunk.micro_batch} (run {self.store.run_id}); stopping instead of skipping the update")
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.check_weights(chunk)
        self.optimizer_steps += 1
        self.maybe_ema_step()
        return float(norm)

    def maybe_ema_step(self) -> None:
        """The evaluation EMA after optimizer step n = self.optimizer_steps, when (n + 1) % ema_every == 0
        (flow_grpo's EMAModuleWrapper(update_step_interval=8); every step when 1), with the warm-up decay
        min(ema_decay, (1 + n) / (10 + n)) counted in optimizer steps, as every reference counts it."""
        n = self.optimizer_steps
        if (n + 1) % max(1, self.cfg.finetune.ema_every):
            return
        self.nets.ema_updates = n - 1  # PolicyNets.ema_step counts this up to n for its warm-up decay
        self.nets.ema_step()

    def check_weights(self, chunk: Chunk) -> None:
        """Stop when the update left a trained weight non-finite or diverged (|w| > WEIGHT_LIMIT).

        Checked after every optimizer step, before the EMA and any checkpoint take the weights, so
        the last checkpoint of a run stopped here is finite and from before the divergence.
        """
        largest = float(torch.nn.utils.get_total_norm([p.detach() for p in self.params], norm_type=math.inf))
        if math.isfinite(largest) and largest <= WEIGHT_LIMIT:  # inf-norm = max |w|; NaN propagates
            return
        raise NonFiniteLossError(
            f"{self.cfg.method}: the weights diverged at step {self.step}, after micro-batch {chunk.micro_batch}: "
            f"max |w| = {largest:.3g} (limit {WEIGHT_LIMIT:.0e}) (run {self.store.run_id}); stopping before they "
            "are checkpointed (the last checkpoint is the previous one); lower finetune.lr or grad_clip")

    # -- evaluation ---------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Sample the fixed eval prompts x seeds with the EMA (or policy) weights and score them."""
        cfg = self.cfg
        self.timer.step = self.step
        seeds = cfg.eval.seeds_per_prompt
        ids = [r.id for r in self.eval_prompts for _ in range(seeds)]
        texts = [r.text for r in self.eval_prompts for _ in range(seeds)]
        skills = [r.skill for r in self.eval_prompts for _ in range(seeds)]
        cand = [s for _ in self.eval_prompts for s in range(seeds)]
        net = "ema" if cfg.eval.use_ema else "policy"
        with self.engine.adapter.at_resolution(eval_resolution(cfg)):  # the protocol's, whatever the run trains at
            rollout = self.engine.sample(ids, texts, cand, net=net, sampler=eval_sampler(cfg), phase="eval",
                                         stream="eval")
        metrics: dict[str, float] = {}
        samples: list[dict[str, Any]] = []  # one row per (reward, prompt, eval seed): the report's paired comparisons
        with self.engine.phase("eval", precision="full", n_images=len(ids)):
            for name, reward in self.eval_rewards.items():
                scores = self.engine.score_with(reward, rollout)[0].double()
                metrics[name] = float(scores.mean())
                samples += [dict(self._metric_row("eval_sample", name, value), prompt_id=pid, eval_seed=c)
                            for pid, c, value in zip(ids, cand, scores.tolist())]
                for skill in sorted({s for s in skills if s is not None}):  # .txt prompt sets have none
                    mask = torch.tensor([s == skill for s in skills])
                    metrics[f"{name}/{skill}"] = float(scores[mask].mean())
            checks: dict[str, Any] = {}  # evaluation checks the rewards carry (shapes: extra_objects), once each
            for reward in self.eval_rewards.values():
                checks.update({k: fn for k, fn in getattr(reward, "checks", {}).items() if k not in checks})
            for check, fn in checks.items():
                values = self.engine.score_with(fn, rollout)[0].double()
                samples += [dict(self._metric_row("eval_check", check, value), prompt_id=pid, eval_seed=c, skill=sk)
                            for pid, c, sk, value in zip(ids, cand, skills, values.tolist())]
        self.store.append("metrics", [self._metric_row("eval", k, v) for k, v in metrics.items()] + samples)
        self._flush_timings()
        if not self.dist.is_main:
            return metrics
        writer = self.writer()
        for key, value in metrics.items():
            writer.add_scalar(f"eval/{key}", value, self.step)
        # the grid shows prompts whose images rank 0 holds (its shard starts at row 0), every skill in turn
        held = len(rollout) if rollout.image_rows is None else len(rollout.image_rows)
        pool = self.eval_prompts[: min(len(self.eval_prompts), held // seeds)]
        picked = grid_prompt_indices([r.skill for r in pool], cfg.eval.grid_prompts)
        rows = [i * seeds + s for i in picked for s in range(seeds)]
        self._save_grid(rollout.images[rows], columns=seeds, records=[pool[i] for i in picked])
        if self.progress:
            self.progress(self.store.run_id, self.step, "eval", metrics)
        return metrics

    def _save_grid(self, images: torch.Tensor, columns: int, records=()) -> None:
        """samples/eval_step_<step>.png (one row per prompt, one column per eval seed) and a .json beside it
        naming the rows' prompts, read by the report's sample grids."""
        from PIL import Image

        if images.numel() == 0:
            return
        b, c, h, w = images.shape
        rows = math.ceil(b / columns)
        grid = torch.zeros(c, rows * h, columns * w)
        for i in range(b):
            r, col = divmod(i, columns)
            grid[:, r * h:(r + 1) * h, col * w:(col + 1) * w] = images[i].float().cpu()
        array = (grid.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        path = Path(self.store.run_dir) / "samples" / f"eval_step_{self.step:06d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(path)
        meta = {"step": self.step, "stream": "eval", "columns": columns, "seeds": list(range(columns)),
                "cell": [h, w], "rows": [{"id": r.id, "text": r.text, "skill": r.skill} for r in records]}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")

    # -- records ------------------------------------------------------------------------------------
    def _metric_row(self, split: str, metric: str, value: float) -> dict[str, Any]:
        return {"step": self.step, "split": split, "metric": metric, "value": value,
                "images_seen": self.images_seen, "wall_s": self.wall_s}

    def _flush_timings(self) -> None:
        rows = [r.row() for r in self.timer.drain()]
        for row in rows:
            row["step"] = self.step
        self.store.append("timings", rows)

    def record_iteration(self, batch: Batch, stats: dict[str, float], gap: dict[str, float] | None = None) -> None:
        metrics = {**batch.logs, **stats}
        gap = gap or {}
        self.store.append("metrics", [self._metric_row("train", k, v) for k, v in metrics.items()]
                          + [self._metric_row(explore_gap.SPLIT, k, v) for k, v in gap.items()])
        self.store.append("candidates", [{"step": self.step, **c.row()} for c in batch.candidates])
        self._flush_timings()
        if not self.dist.is_main:
            return
        writer = self.writer()
        for key, value in [*((f"train/{k}", v) for k, v in metrics.items()),
                           *((f"{explore_gap.SPLIT}/{k}", v) for k, v in gap.items())]:
            if math.isfinite(value):
                writer.add_scalar(key, value, self.step)
        if self.progress:
            self.progress(self.store.run_id, self.step, "train", metrics)

    def writer(self):
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(Path(self.store.run_dir) / "tb"))
        return self._writer

    # -- checkpoints --------------------------------------------------------------------------------
    #: What a resume reads from a checkpoint's state (a file lacking any is unreadable: the previous one is used).
    CHECKPOINT_KEYS = {"step": None, "wall_s": None, "images_seen": None, "optimizer": None, "method": None,
                       "nets": {"mode": None, "ema_updates": None, "trainable": None},
                       "rng": {"torch": None, "numpy": None, "python": None}}

    def state_dict(self) -> dict:
        """Tensors and plain data only (solbench.results.checkpoint): resumes load it with weights_only=True."""
        return {"step": self.step, "wall_s": self.wall_s, "images_seen": self.images_seen,
                "optimizer_steps": self.optimizer_steps, "nets": self.nets.state_dict(),
                "optimizer": self.optimizer.state_dict(), "method": self.method.state_dict(), "rng": rng_state(),
                "run_id": self.store.run_id}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        self.wall_s = float(state["wall_s"])
        self.images_seen = int(state["images_seen"])
        self.nets.load_state_dict(state["nets"])
        # checkpoints from before ema_every counted the steps in the EMA's update count (one per step)
        self.optimizer_steps = int(state.get("optimizer_steps", self.nets.ema_updates))
        self.optimizer.load_state_dict(state["optimizer"])
        self.method.load_state_dict(state["method"])
        set_rng_state(state["rng"])
