#!/usr/bin/env python
"""Noise-image pairs drawn by a tiny model, for a reflow stage of scripts/pretrain_tiny.py.

Reflow (Liu et al. 2022, "Flow Straight and Fast", the 2-rectified flow): train a flow on the
couplings (noise z, the image the model's own ODE draws from z) instead of independent (z, data)
pairs; the new flow's paths are straighter, so a short ODE lands where the full one does. This
script draws the couplings: captions from the pretraining grammar (10 % dropped to "" as in
pretraining), noise from a generator seeded by (--seed, chunk), images with the sampler the
harness's rollouts use at their full budget (DiffusionNFT's and Sol-RL's dpm2, 10 steps, the model's
sigma shift). With --guidance W the captioned pairs are drawn with classifier-free guidance W (the
empty-caption pairs never are): a stage on them also distils the guidance into the conditional flow,
as FLUX.1-dev's guidance distillation does.

    python scripts/reflow_pairs.py --model-path build/tiny_v3c --count 8192 --out build/pairs_a.safetensors

The output holds `noise` and `images` (float32 [count, 3, R, R], images in [-1, 1] unclamped as
the ODE ends) and the captions and settings in its metadata. A pure function of the options.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from solbench.models.base import shifted_sigmas
from solbench.models.tiny import load_tiny
from solbench.engine.sampling import SamplerSpec, sample
from solbench.world.grammar import sample_training_pair


def chunk_captions(seed: int, chunk: int, size: int, caption_dropout: float) -> list[str]:
    """Captions of one chunk: a pure function of (seed, chunk)."""
    rng = np.random.default_rng([seed, chunk, 17])
    return ["" if rng.random() < caption_dropout else sample_training_pair(rng)[1] for _ in range(size)]


@torch.no_grad()
def draw_pairs(model, captions: list[str], noise: torch.Tensor, steps: int, shift: float,
               guidance: float | None, sampler: str = "dpm2") -> torch.Tensor:
    """The images the model's `sampler` ODE draws from `noise` for `captions` (CFG `guidance` on captioned rows)."""
    tokens, pooled = model.encode(captions)
    guided = torch.tensor([bool(c) for c in captions]) if guidance is not None else None
    if guided is not None and not guided.any():  # only empty captions: nothing to guide
        guided = None
    if guided is not None:
        u_tokens, u_pooled = model.encode([""] * len(captions))

    def velocity(x, t):
        v = model.velocity(model.transformer, x, t, tokens, pooled)
        if guided is None:
            return v
        v_u = model.velocity(model.transformer, x, t, u_tokens, u_pooled)
        v_cfg = v_u + guidance * (v - v_u)
        return torch.where(guided.view(-1, 1, 1, 1), v_cfg, v)

    images, _ = sample(velocity, noise, shifted_sigmas(steps, shift), SamplerSpec(sampler, steps))
    return images


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", type=Path, required=True, help="the teacher: a folder with tiny_t2i.safetensors/.json")
    p.add_argument("--count", type=int, default=8192, help="pairs to draw (a multiple of --chunk)")
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=10, help="ODE steps (the rollouts' full budget)")
    p.add_argument("--sampler", choices=("dpm2", "euler"), default="dpm2")
    p.add_argument("--shift", type=float, default=None, help="sigma shift (default: the model's)")
    p.add_argument("--guidance", type=float, default=None, help="CFG scale of the captioned pairs (default: none)")
    p.add_argument("--caption-dropout", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.count < 1 or args.chunk < 1 or args.count % args.chunk:
        p.error(f"--count ({args.count}) must be a positive multiple of --chunk ({args.chunk})")
    torch.set_num_threads(args.threads)
    model = load_tiny(folder=args.model_path)
    shift = model.config.shift if args.shift is None else args.shift
    shape = tuple(model.config.latent_shape)
    noises, images, captions = [], [], []
    t0 = time.perf_counter()
    for chunk in range(args.count // args.chunk):
        caps = chunk_captions(args.seed, chunk, args.chunk, args.caption_dropout)
        gen = torch.Generator().manual_seed(int(np.random.default_rng([args.seed, chunk, 23]).integers(2**62)))
        z = torch.randn((args.chunk, *shape), generator=gen)
        noises.append(z)
        images.append(draw_pairs(model, caps, z, args.steps, shift, args.guidance, args.sampler))
        captions += caps
        print(f"chunk {chunk + 1}/{args.count // args.chunk} {time.perf_counter() - t0:.0f} s", flush=True)
    meta = {"captions": json.dumps(captions), "settings": json.dumps(
        {"model_path": str(args.model_path), "seed": args.seed, "steps": args.steps, "sampler": args.sampler,
         "shift": shift, "guidance": args.guidance, "caption_dropout": args.caption_dropout})}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    save_file({"noise": torch.cat(noises).contiguous(), "images": torch.cat(images).contiguous()}, str(tmp), metadata=meta)
    tmp.replace(args.out)
    print(f"{args.count} pairs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
