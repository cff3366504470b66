#!/usr/bin/env python
"""Pretrain the embedded world's tiny text-to-image model (deterministic, CPU, under an hour).

Rectified flow on freshly rendered scenes: every step draws `--batch` random prompts of the shapes
grammar and a scene for each (numpy generator seeded by (seed, step), so a resumed run sees the same
data), drops 10% of captions to "" (the unconditional prompt for CFG), samples t from a logit-normal
and regresses the velocity eps - x0. AdamW with warm-up, a constant phase and a cosine decay over
the last 30% of steps (so a run can be resumed with a new budget before its decay starts); an EMA
of the weights (decay 0.999) is what ships. Recipe and sizes follow the feasibility run
(docs/embedded-world.md).

    python scripts/pretrain_tiny.py --measure 20          # throughput: seconds per step, then exit
    # the shipped weights (v2, about 90 min on 2 cores): stage 1, 4500 steps of flow matching (v1),
    # then two stages of 1500 steps with the NVFP4 consistency loss, recorded with sampling shift 3
    python scripts/pretrain_tiny.py --steps 4500 --out build/tiny_v1 --workdir build/pretrain_tiny_v1 && \
    python scripts/pretrain_tiny.py --init-from build/tiny_v1 --out build/tiny_v2a \
      --workdir build/pretrain_tiny_v2a --steps 1500 --lr 3e-4 --warmup 50 --ema 0.995 \
      --noise-consistency 20 --consistency-kind nvfp4 && \
    python scripts/pretrain_tiny.py --init-from build/tiny_v2a --steps 1500 --lr 3e-4 --warmup 50 \
      --ema 0.995 --noise-consistency 20 --consistency-kind nvfp4 --threads 1 --shift 3
    python scripts/pretrain_tiny.py --resume [same options]          # continue an interrupted stage
    python scripts/pretrain_tiny.py --heads 8 --steps 3000 ...       # a wider model (width 256), from scratch
    python scripts/pretrain_tiny.py --eval                           # re-evaluate solbench/assets/

The later stages add an NVFP4 consistency loss (--noise-consistency with --consistency-kind nvfp4:
the velocity of the network with its block weights NVFP4-rounded, straight-through, is pulled
towards the full-precision velocity), so that the explore copy ranks seeds nearly as full
precision does, as on the paper's large models; docs/embedded-world.md has what it gains and costs.
--consistency-recipe R takes the term against explore recipe R's own copy instead (its layers, its
weight blocks and, for a W4A4 recipe, its input rounding), with --consistency-exclude and
--consistency-anchor to change how single layers enter it; against nvfp4_tiny_flux (FLUX's coverage)
the measured stages bought rank fidelity at a cost in samples that v2 could not pay (the doc's
"At FLUX's coverage"). --distill-from T adds a distillation term towards a frozen teacher T (usually the
stage's own --init-from model), so that what the stage changes is the copy's robustness more than what the
model draws.
--reflow-pairs F trains on the noise-image couplings a teacher drew (scripts/reflow_pairs.py) instead of fresh
scenes: a reflow stage (the 2-rectified flow), whose straighter paths let a short ODE land where the full one
does; drawn with guidance, the couplings also distil the guidance into the conditional flow.
--reflow-fraction F takes only that share of each batch from the couplings and the rest from fresh scenes, so
the stage straightens the flow while the data, not the teacher's own samples, keep what it draws.

Checkpoints (model, EMA, optimizer, step) go to build/pretrain_tiny/ every --checkpoint-every steps,
and each checkpoint also exports the EMA weights to solbench/assets/, so a partial run is usable.
The budget is a step count, not a time, so two runs give the same weights.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from solbench.models.tiny import ASSET_NAME, TinyT2I, TinyT2IConfig, asset_path, load_tiny, save_tiny
from solbench.measure.tiny_accuracy import evaluate
from solbench.world.grammar import sample_training_pair
from solbench.world.scenes import render_batch

REPO = Path(__file__).resolve().parents[1]


def make_batch(seed: int, step: int, batch: int, caption_dropout: float):
    """Images in [-1, 1], captions, noise and times of one step: a pure function of (seed, step)."""
    rng = np.random.default_rng([seed, step])
    pairs = [sample_training_pair(rng) for _ in range(batch)]
    images = render_batch([p[0] for p in pairs]) * 2 - 1
    captions = ["" if rng.random() < caption_dropout else p[1] for p in pairs]
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    noise = torch.randn(images.shape, generator=gen)
    t = torch.sigmoid(torch.randn(batch, generator=gen))  # logit-normal(0, 1)
    return images, captions, noise, t


class ReflowPairs:
    """Noise-image couplings drawn by a teacher (scripts/reflow_pairs.py), served as training batches.

    A reflow step regresses the same velocity eps - x0 as pretraining, with (x0, eps) one of the
    teacher's couplings (its image, the noise it drew it from) instead of an independent pair: the
    2-rectified flow, whose paths are straighter. The rows of a step and its times are a pure
    function of (seed, step), so a resumed stage sees the same batches.
    """

    def __init__(self, paths: list[Path]):
        from safetensors import safe_open

        noises, images, self.captions, self.settings = [], [], [], []
        for path in paths:
            if not path.is_file():
                raise SystemExit(f"--reflow-pairs: {path} does not exist (make it with scripts/reflow_pairs.py)")
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if "captions" not in meta:
                    raise SystemExit(f"--reflow-pairs: {path} holds no captions (not written by scripts/reflow_pairs.py)")
                noises.append(f.get_tensor("noise"))
                images.append(f.get_tensor("images"))
                self.captions += json.loads(meta["captions"])
                self.settings.append(json.loads(meta.get("settings", "{}")))
        self.noise, self.images = torch.cat(noises), torch.cat(images)

    def __len__(self) -> int:
        return len(self.captions)

    def batch(self, seed: int, step: int, batch: int):
        rng = np.random.default_rng([seed, step, 29])
        rows = rng.choice(len(self), size=batch, replace=False)
        gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
        t = torch.sigmoid(torch.randn(batch, generator=gen))  # logit-normal(0, 1), as pretraining
        idx = torch.from_numpy(rows)
        return self.images[idx], [self.captions[i] for i in rows], self.noise[idx], t


def training_batch(seed: int, step: int, batch: int, caption_dropout: float, pairs: ReflowPairs | None = None,
                   reflow_fraction: float = 1.0):
    """One step's (images, captions, noise, t): fresh scenes (``make_batch``), or with ``pairs`` the first
    round(reflow_fraction x batch) rows from the teacher's couplings (which carry their own dropped captions)
    and the rest fresh scenes with independent noise, so a mixed stage straightens the flow on the couplings
    while the scenes keep it on the data."""
    if pairs is None:
        return make_batch(seed, step, batch, caption_dropout)
    k = round(reflow_fraction * batch)
    rows = pairs.batch(seed, step, k)
    if k == batch:
        return rows
    fresh = make_batch(seed, step, batch - k, caption_dropout)
    return (torch.cat([rows[0], fresh[0]]), rows[1] + fresh[1], torch.cat([rows[2], fresh[2]]),
            torch.cat([rows[3], fresh[3]]))


def block_linear_layers(model: TinyT2I) -> list[tuple[str, torch.nn.Linear]]:
    """(name in model.transformer, layer) of the Linear layers inside the transformer blocks, except proj_out.

    These are the weights weight-noise and consistency training perturb: every block layer an NVFP4
    recipe of this model could quantize. The shipped stage 2 was trained with all of them rounded;
    nvfp4_tiny now keeps the attention projections among them in fp32 as well (its size rule), so
    the explore copy rounds a subset of what that stage made the model robust to. Embedders, norm_out
    and the output projections stay clean, as they stay in full precision in every tiny recipe.
    """
    return [(name, module) for name, module in model.transformer.named_modules()
            if isinstance(module, torch.nn.Linear) and "transformer_blocks." in name and not name.endswith("proj_out")]


def recipe_linear_layers(model: TinyT2I, recipe) -> list[tuple[str, torch.nn.Linear]]:
    """(name in model.transformer, layer) of the Linear layers the explore recipe `recipe` (a name or
    QuantRecipe) quantizes: the layers a consistency stage against that recipe rounds."""
    from solbench.quant import recipe_for_model

    recipe = recipe_for_model(recipe, model.transformer)  # a threshold per width, at this model's
    return [(name, module) for name, module in model.transformer.named_modules()
            if isinstance(module, torch.nn.Linear) and recipe.skip_reason(name, module) is None]


class quantized_inputs:
    """Context manager: the listed layers see their input fake-quantized (`fmt`, `block`), straight-through.

    Forward pre-hooks, registered on entry and removed on exit, replace a layer's input x by
    x + (Q(x) - x).detach(): the forward computes what the explore copy's W4A4 layer computes, the
    gradient passes as if no rounding happened (activations are not parameters; what is trained is
    the weights that produce and consume them).
    """

    def __init__(self, modules: list[torch.nn.Module], fmt: str, block):
        self.modules, self.fmt, self.block = modules, fmt, block
        self.handles: list = []

    def _hook(self, module, args):
        from solbench.quant import fake_quantize

        x = args[0]
        return (x + (fake_quantize(x.detach(), self.fmt, self.block) - x.detach()),) + tuple(args[1:])

    def __enter__(self):
        self.handles = [m.register_forward_pre_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc):
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        return False


def block_linear_weights(model: TinyT2I) -> list[torch.Tensor]:
    """The weights of `block_linear_layers`."""
    return [module.weight for _, module in block_linear_layers(model)]


class perturbed_weights:
    """Context manager: multiply each weight by (1 + sigma * N(0, 1)) and restore it on exit.

    Weight-noise training (Graves 2011; Hinton & van Camp 1993): the loss is taken at a random
    point near the weights, so training prefers weights whose function survives small relative
    perturbations of every element, which is what NVFP4's per-block rounding (5-15% relative
    error per element) applies at explore time. Large pretrained models are robust to it without
    help; a 2M-parameter model is not (docs/embedded-world.md). The noise is a pure function of
    (seed, step), so a resumed run draws the same noise.
    """

    def __init__(self, weights: list[torch.Tensor], sigma: float, seed: int, step: int, *, nvfp4: bool = False):
        self.weights, self.sigma, self.seed, self.step, self.nvfp4 = weights, sigma, seed, step, nvfp4
        self.saved: list[torch.Tensor] = []

    def __enter__(self):
        if self.nvfp4:  # quantization-aware step: the explore copy's weight rounding instead of noise
            from solbench.quant import fake_quantize

            with torch.no_grad():
                for w in self.weights:
                    self.saved.append(w.detach().clone())
                    w.copy_(fake_quantize(w.detach(), "nvfp4", (16, 16)))
            return self
        if self.sigma <= 0:
            return self
        gen = torch.Generator().manual_seed(int(np.random.default_rng([self.seed, self.step, 7]).integers(2**62)))
        with torch.no_grad():
            for w in self.weights:
                self.saved.append(w.detach().clone())
                w.mul_(1 + self.sigma * torch.randn(w.shape, generator=gen))
        return self

    def __exit__(self, *exc):
        with torch.no_grad():
            for w, clean in zip(self.weights, self.saved):
                w.copy_(clean)
        self.saved.clear()
        return False


class _WithWeights(torch.nn.Module):
    """The transformer called with some of its weights replaced (torch.func.functional_call)."""

    def __init__(self, net: torch.nn.Module, overrides: dict[str, torch.Tensor]):
        super().__init__()
        self.net, self.overrides = net, overrides

    def forward(self, **kwargs):
        return torch.func.functional_call(self.net, self.overrides, args=(), kwargs=kwargs)


def perturbation_consistency(model: TinyT2I, x_t, t, tokens, pooled, v_clean, sigma: float, seed: int, step: int,
                             kind: str = "gaussian", min_t: float = 0.0, max_t: float = 1.0, recipe=None,
                             weights_only: bool = False, anchored: tuple[str, ...] = (), excluded: tuple[str, ...] = ()):
    """Mean squared change of the velocity when the weights the explore copy quantizes are perturbed.

    The perturbed layers: `block_linear_layers` (recipe None, how v2 was trained), or the layers the
    explore recipe `recipe` quantizes, rounded in its format and weight block; with a recipe whose
    activations are quantized (W4A4) and not `weights_only`, their inputs are rounded too
    (`quantized_inputs`), so the perturbed forward is the explore copy's own.
    kind "nvfp4": each such weight NVFP4-rounded in 16x16 tiles, as the explore copy's are, added
    straight-through (w + (Q(w) - w) with the difference detached). kind "gaussian": additive noise
    of std sigma x the layer's RMS weight (NVFP4's rounding error is 11% of it on v1), drawn from
    (seed, step). Gradients flow through both the clean and the perturbed forward, so training makes
    the network's output agree with its perturbed self. Measured on v2a (stage 2): this does not
    pull the weights onto the FP4 grid (their rounding error stays 11% of the norm), so LoRA updates
    still survive re-quantization. Only samples with min_t <= t <= max_t count (t = 1: pure noise).

    `anchored`: names (in model.transformer) of perturbed layers whose rounded weight enters the
    perturbed forward as a constant, with no straight-through path. For a layer whose output is the
    velocity itself (the final proj_out) the two straight-through paths cancel: the gradient of
    |Q(W) x' - W x|^2 through Q(W) = W + const is +2 r x'^T, through W -2 r x^T, which leaves only
    r (x' - x)^T (x' the input in the rounded forward), so almost nothing moves W towards its rounding
    and the term cannot shrink that layer's share of the gap (on v2 most of the FLUX analogue's).
    Anchored, only the clean path trains W, towards Q(W) in the directions its inputs take.
    `excluded`: names of layers the term leaves in full precision although the recipe quantizes them:
    the final proj_out's rounding puts a velocity error into the term that training hardly removes
    (straight-through cancels on its weights, and nothing can remove its input rounding), and chasing
    it costs the model its samples (docs/embedded-world.md).
    """
    from solbench.quant import fake_quantize, get_recipe

    gen = torch.Generator().manual_seed(int(np.random.default_rng([seed, step, 11]).integers(2**62)))
    if recipe is None:
        layers, fmt, block, activations = block_linear_layers(model), "nvfp4", (16, 16), False
    else:
        recipe = get_recipe(recipe)
        layers = [(name, m) for name, m in recipe_linear_layers(model, recipe) if name not in excluded]
        fmt, block = recipe.format, recipe.weight_block
        activations = recipe.activations and not weights_only and kind == "nvfp4"
    overrides = {}
    for name, module in layers:
        w = module.weight
        if kind == "nvfp4":  # the explore copy's own rounding, straight-through
            noise = fake_quantize(w.detach(), fmt, block) - w.detach()
        else:
            noise = torch.randn(w.shape, generator=gen) * (sigma * w.detach().pow(2).mean().sqrt())
        overrides[f"{name}.weight"] = (w.detach() if name in anchored else w) + noise
    inputs = quantized_inputs([m for _, m in layers] if activations else [], fmt, recipe.activation_block if activations else None)
    with inputs:
        v_noisy = model.velocity(_WithWeights(model.transformer, overrides), x_t, t, tokens, pooled)
    if min_t <= 0 and max_t >= 1:
        return torch.nn.functional.mse_loss(v_noisy, v_clean)
    # Only the samples with min_t <= t <= max_t count (averaged over the whole batch).
    per_sample = (v_noisy - v_clean).pow(2).flatten(1).mean(1)
    return (per_sample * ((t >= min_t) & (t <= max_t)).to(per_sample.dtype)).mean()


def lr_factor(step: int, warmup: int, total: int, decay_fraction: float = 0.3, floor: float = 0.05) -> float:
    """Warm-up, stable, decay: linear warm-up, constant, then cosine to `floor` over the last 30%.

    Until the decay starts the schedule does not depend on `total`, so a run can be resumed with a
    larger or smaller --steps and still match a fresh run with that budget exactly.
    """
    if step < warmup:
        return (step + 1) / warmup
    decay_start = int(total * (1 - decay_fraction))
    if step < decay_start:
        return 1.0
    progress = min(1.0, (step - decay_start) / max(1, total - decay_start))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def write_evaluation(folder: Path) -> int:
    """Evaluate the weights in `folder` and write tiny_t2i_eval.json next to them."""
    model = load_tiny(folder=folder)  # eval mode
    t0 = time.perf_counter()
    results = evaluate(model)
    train_meta = folder / f"{ASSET_NAME}_train.json"
    if train_meta.is_file():
        results["trained_steps"] = json.loads(train_meta.read_text())["step"]
    results["eval_seconds"] = round(time.perf_counter() - t0, 1)
    (folder / f"{ASSET_NAME}_eval.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=4500, help="optimizer steps (the budget; 4500 made the shipped weights)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--ema", type=float, default=0.999)
    p.add_argument("--caption-dropout", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--heads", type=int, default=None,
                   help="attention heads of 32 channels for a model trained from scratch: its width is 32 x heads "
                        "(default 4, the shipped width 128; 8 = width 256)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--checkpoint-every", type=int, default=250)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--workdir", type=Path, default=REPO / "build" / "pretrain_tiny")
    p.add_argument("--out", type=Path, default=None, help="weights folder (default: solbench/assets)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --workdir")
    p.add_argument("--measure", type=int, default=0, help="time this many steps (after 3 warm-up) and exit")
    p.add_argument("--eval", action="store_true",
                   help="only evaluate the weights in --out on shapes/heldout and write tiny_t2i_eval.json")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation after training")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from these weights (a folder holding tiny_t2i.safetensors/.json) instead of a "
                        "random init: the second stage of the shipped model starts from the first")
    p.add_argument("--weight-noise", type=float, default=0.0,
                   help="multiplicative Gaussian noise (relative std) on the transformer blocks' Linear weights "
                        "for each step's forward and backward (weight-noise training); 0 = off")
    p.add_argument("--nvfp4-every", type=int, default=0,
                   help="every K-th step runs its forward and backward with the quantized weights NVFP4-rounded "
                        "(16x16 blocks, as the explore copy's), the gradient applied to the full-precision weights "
                        "(straight-through); 0 = off")
    p.add_argument("--noise-consistency", type=float, default=0.0,
                   help="weight of the perturbation-consistency loss (velocity change under Gaussian weight noise "
                        "of --consistency-sigma x each quantized layer's RMS weight); 0 = off")
    p.add_argument("--consistency-sigma", type=float, default=0.11)
    p.add_argument("--consistency-kind", choices=("gaussian", "nvfp4"), default="gaussian",
                   help="the weight perturbation of the consistency loss: Gaussian noise, or NVFP4 rounding (16x16)")
    p.add_argument("--consistency-recipe", default=None,
                   help="explore recipe the consistency loss is taken against (e.g. nvfp4_tiny_flux): the layers it "
                        "quantizes, rounded as it rounds them, weights and (W4A4) activations; default: every block "
                        "Linear but proj_out, weights only (how v2 was trained)")
    p.add_argument("--consistency-weights-only", action="store_true",
                   help="with --consistency-recipe: round the weights only, not the layers' inputs")
    p.add_argument("--consistency-anchor", default="",
                   help="comma-separated layer names (in the transformer, e.g. proj_out) whose rounded weights enter "
                        "the consistency term as constants, so it pulls their clean weights towards their rounding "
                        "(straight-through, the two paths cancel for the output layer)")
    p.add_argument("--consistency-exclude", default="",
                   help="with --consistency-recipe: comma-separated layer names the consistency term leaves in full "
                        "precision although the recipe quantizes them, e.g. proj_out")
    p.add_argument("--consistency-min-t", type=float, default=0.0,
                   help="apply the consistency loss only to samples with t >= this (1 = pure noise); 0 = all")
    p.add_argument("--consistency-max-t", type=float, default=1.0,
                   help="... and with t <= this; 1 = all")
    p.add_argument("--distill-from", type=Path, default=None,
                   help="a teacher (weights folder, usually the --init-from model): adds --distill-weight x the mean "
                        "squared gap between this model's velocity and the frozen teacher's on the same inputs, so a "
                        "consistency stage keeps what the teacher draws while it learns to survive the rounding")
    p.add_argument("--distill-weight", type=float, default=None, help="with --distill-from (default 1)")
    p.add_argument("--reflow-pairs", type=Path, action="append", default=[],
                   help="train on these noise-image couplings (scripts/reflow_pairs.py; repeatable) instead of fresh "
                        "scenes: a reflow stage, whose flow is straighter, so a short ODE lands where the full one does")
    p.add_argument("--reflow-fraction", type=float, default=1.0,
                   help="share of each batch drawn from --reflow-pairs, the rest fresh scenes (default 1: all pairs)")
    p.add_argument("--shift", type=float, default=None,
                   help="sampling sigma-schedule shift recorded with the weights (tiny_t2i.json) and used by the "
                        "evaluation (default: the --init-from model's, else 1.0, a uniform grid)")
    args = p.parse_args(argv)
    if args.distill_weight is not None and args.distill_from is None:  # before anything loads
        p.error("--distill-weight needs --distill-from (the teacher)")
    if args.distill_weight is None:
        args.distill_weight = 1.0

    torch.set_num_threads(args.threads)
    out_dir = args.out or asset_path(f"{ASSET_NAME}.json").parent
    if args.eval:
        return write_evaluation(out_dir)
    torch.manual_seed(args.seed)
    if args.init_from is not None:
        model = load_tiny(folder=args.init_from)  # all randomness below comes from seeded generators
        if args.heads is not None and args.heads != model.config.num_attention_heads:
            p.error(f"--heads {args.heads}: the --init-from model has {model.config.num_attention_heads} heads; "
                    "a stage continues its model's width")
    else:
        model = TinyT2I(TinyT2IConfig() if args.heads is None else TinyT2IConfig(num_attention_heads=args.heads))
    if args.shift is not None:  # recorded in tiny_t2i.json: the adapter's default sigma shift
        model.config.shift = args.shift
    model.train()
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, args.warmup, args.steps))
    start = 0
    ckpt_path = args.workdir / "checkpoint.pt"
    if args.resume and ckpt_path.is_file():
        state = torch.load(ckpt_path, map_location="cpu")
        model.load_state_dict(state["model"])
        ema.load_state_dict(state["ema"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        start = state["step"]
        print(f"resumed at step {start}", flush=True)

    weights, config = out_dir / f"{ASSET_NAME}.safetensors", out_dir / f"{ASSET_NAME}.json"
    init_meta = None
    if args.init_from is not None:  # record the stage this one continues (its own training record)
        previous = args.init_from / f"{ASSET_NAME}_train.json"
        init_meta = json.loads(previous.read_text()) if previous.is_file() else str(args.init_from)

    def checkpoint(step: int, losses: list[float]) -> None:
        args.workdir.mkdir(parents=True, exist_ok=True)
        tmp = ckpt_path.with_suffix(".tmp")
        torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "opt": opt.state_dict(),
                    "sched": sched.state_dict(), "step": step}, tmp)
        tmp.replace(ckpt_path)
        out_dir.mkdir(parents=True, exist_ok=True)
        save_tiny(ema, weights, config)
        meta = {"step": step, "steps": args.steps, "batch": args.batch, "lr": args.lr, "seed": args.seed,
                "ema": args.ema, "caption_dropout": args.caption_dropout, "warmup": args.warmup,
                "weight_noise": args.weight_noise, "nvfp4_every": args.nvfp4_every,
                "noise_consistency": args.noise_consistency, "consistency_sigma": args.consistency_sigma,
                "consistency_kind": args.consistency_kind, "consistency_min_t": args.consistency_min_t,
                "consistency_max_t": args.consistency_max_t, "consistency_recipe": args.consistency_recipe,
                "consistency_weights_only": args.consistency_weights_only,
                "consistency_anchor": list(anchored), "consistency_exclude": list(excluded),
                "init_from": init_meta, "threads": args.threads,
                "distill_from": None if args.distill_from is None else str(args.distill_from),
                "distill_weight": args.distill_weight if args.distill_from is not None else None,
                "reflow_pairs": [str(path) for path in args.reflow_pairs] or None,
                "reflow_settings": pairs.settings if pairs is not None else None,
                "reflow_fraction": args.reflow_fraction if pairs is not None else None,
                "recent_loss": float(np.mean(losses[-args.log_every:])) if losses else None,  # with the consistency term
                "recent_consistency": float(np.mean(consistencies[-args.log_every:])) if consistencies else None,
                "recent_distill": float(np.mean(distills[-args.log_every:])) if distills else None}
        (out_dir / f"{ASSET_NAME}_train.json").write_text(json.dumps(meta, indent=2) + "\n")

    known = dict(model.transformer.named_modules())
    layer_lists = {}
    for option in ("anchor", "exclude"):
        names = tuple(n.strip() for n in getattr(args, f"consistency_{option}").split(",") if n.strip())
        for name in names:
            if not isinstance(known.get(name), torch.nn.Linear):
                p.error(f"--consistency-{option}: {name!r} is no Linear layer of the transformer")
        layer_lists[option] = names
    anchored, excluded = layer_lists["anchor"], layer_lists["exclude"]
    if args.consistency_recipe is None and (excluded or args.consistency_weights_only):
        p.error("--consistency-exclude and --consistency-weights-only need --consistency-recipe")
    consistency_recipe = None
    if args.consistency_recipe is not None:
        from solbench.quant import UnknownRecipeError, recipe_for_model

        try:  # bound to this model's width once, not on every step
            consistency_recipe = recipe_for_model(args.consistency_recipe, model.transformer)
        except UnknownRecipeError as err:
            p.error(f"--consistency-recipe: {err}")
    teacher = None
    if args.distill_from is not None:
        teacher = load_tiny(folder=args.distill_from).eval().requires_grad_(False)
        # The teacher sees the student's noisy latents and encodes the captions with its own text encoder, so
        # its width and depth are free (a wider teacher is a lever); its latents and its words are not.
        for field in ("latent_shape", "vocabulary"):
            mine, theirs = getattr(model.config, field), getattr(teacher.config, field)
            if tuple(mine) != tuple(theirs):
                p.error(f"--distill-from {args.distill_from}: the teacher's {field} {tuple(theirs)} is not the "
                        f"model's {tuple(mine)}")
    pairs = ReflowPairs(args.reflow_pairs) if args.reflow_pairs else None
    if not 0 < args.reflow_fraction <= 1 or (args.reflow_fraction != 1 and pairs is None):
        p.error(f"--reflow-fraction {args.reflow_fraction}: a share in (0, 1] of each batch, with --reflow-pairs")
    if pairs is not None and round(args.reflow_fraction * args.batch) < 1:
        p.error(f"--reflow-fraction {args.reflow_fraction}: no pair in a batch of {args.batch}")
    if pairs is not None and len(pairs) < args.batch:
        p.error(f"--reflow-pairs: {len(pairs)} pairs, fewer than one batch of {args.batch}")
    if pairs is not None and tuple(pairs.images.shape[1:]) != tuple(model.config.latent_shape):
        p.error(f"--reflow-pairs: images of shape {tuple(pairs.images.shape[1:])}, the model draws "
                f"{tuple(model.config.latent_shape)}")
    params, ema_params = list(model.parameters()), list(ema.parameters())
    noisy_weights = block_linear_weights(model) if (args.weight_noise > 0 or args.nvfp4_every > 0) else []
    losses: list[float] = []
    consistencies: list[float] = []
    distills: list[float] = []
    total = args.steps if not args.measure else start + args.measure + 3
    t0 = time.perf_counter()
    for step in range(start, total):
        if args.measure and step == start + 3:
            t0 = time.perf_counter()
        images, captions, noise, t = training_batch(args.seed, step, args.batch, args.caption_dropout, pairs,
                                                    args.reflow_fraction)
        tt = t.view(-1, 1, 1, 1)
        x_t = (1 - tt) * images + tt * noise
        opt.zero_grad(set_to_none=True)
        nvfp4_step = args.nvfp4_every > 0 and step % args.nvfp4_every == args.nvfp4_every - 1
        with perturbed_weights(noisy_weights, args.weight_noise, args.seed, step, nvfp4=nvfp4_step):
            tokens, pooled = model.encode(captions)
            v = model.velocity(model.transformer, x_t, t, tokens, pooled)
            loss = torch.nn.functional.mse_loss(v, noise - images)
            if teacher is not None:
                with torch.no_grad():
                    t_tokens, t_pooled = teacher.encode(captions)
                    v_teacher = teacher.velocity(teacher.transformer, x_t, t, t_tokens, t_pooled)
                distill = torch.nn.functional.mse_loss(v, v_teacher)
                distills.append(distill.item())
                loss = loss + args.distill_weight * distill
            if args.noise_consistency > 0:
                consistency = perturbation_consistency(model, x_t, t, tokens, pooled, v, args.consistency_sigma,
                                                       args.seed, step, args.consistency_kind, args.consistency_min_t,
                                                       args.consistency_max_t, consistency_recipe,
                                                       args.consistency_weights_only, anchored, excluded)
                consistencies.append(consistency.item())
                loss = loss + args.noise_consistency * consistency
            if not torch.isfinite(loss):
                print(f"non-finite loss at step {step}", file=sys.stderr)
                return 1
            loss.backward()  # gradients at the perturbed point, applied to the clean weights
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        with torch.no_grad():
            decay = min(args.ema, (1 + step) / (10 + step))  # short memory early, when weights move fast
            for pe, pm in zip(ema_params, params):
                pe.lerp_(pm, 1 - decay)
        losses.append(loss.item())
        done = step + 1
        if done % args.log_every == 0:
            rate = (done - start) / (time.perf_counter() - t0)
            print(f"step {done}/{args.steps} loss {np.mean(losses[-args.log_every:]):.4f} "
                  + (f"consistency {np.mean(consistencies[-args.log_every:]):.5f} " if consistencies else "")
                  + (f"distill {np.mean(distills[-args.log_every:]):.3e} " if distills else "")
                  + f"lr {sched.get_last_lr()[0]:.2e} {rate:.2f} steps/s", flush=True)
        if not args.measure and (done % args.checkpoint_every == 0 or done == args.steps):
            checkpoint(done, losses)
    if not args.measure and not args.no_eval:
        write_evaluation(out_dir)
    if args.measure:
        sec = (time.perf_counter() - t0) / args.measure
        print(f"{sec:.3f} s/step at batch {args.batch} with {args.threads} threads "
              f"-> {args.steps} steps take about {args.steps * sec / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
