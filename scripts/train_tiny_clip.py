#!/usr/bin/env python
"""Train the tiny CLIP reward (`shapes_clip`) contrastively on rendered shapes scenes (CPU, minutes).

Each step renders `--batch` scenes of random grammar prompts (numpy generator seeded by
(seed, step): deterministic), degrades half of them like generated samples (Gaussian blur of
random width and pixel noise), and adds one hard-negative caption per scene (one count, colour,
shape or relation changed: solbench.world.grammar.hard_negative). Loss: symmetric InfoNCE with a
learned temperature; the image-to-text side also ranks against all hard negatives. Captions that
mean the same thing ("A left of B" / "B right of A", or the same prompt twice) are masked out as
negatives. Writes solbench/assets/tiny_clip.{safetensors,json} and tiny_clip_metrics.json
(held-out accuracy of picking the true caption over its hard negative, per skill).

    python scripts/train_tiny_clip.py --steps 800
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from solbench.models.tiny import asset_path
from solbench.rewards.tiny_clip import ASSET_NAME, TinyCLIP, TinyCLIPConfig, save_tiny_clip
from solbench.world.grammar import SKILLS, caption, hard_negative, sample_requirements, sample_scene
from solbench.world.scenes import render_batch


def degrade(images: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Blur half the batch with a random-width Gaussian and add pixel noise, as generated samples look."""
    half, channels = images.shape[0] // 2, images.shape[1]
    sigma = 0.3 + 0.9 * torch.rand(half, generator=gen)  # one blur width per image
    radius = 2
    taps = torch.arange(-radius, radius + 1, dtype=torch.float32)
    k = torch.exp(-0.5 * (taps[None] / sigma[:, None]) ** 2)
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(channels, 0)  # [half*C, taps]
    # Separable blur as a grouped convolution: every (image, channel) plane is its own group.
    x = images[:half].reshape(1, half * channels, *images.shape[2:])
    x = F.conv2d(F.pad(x, (radius, radius, 0, 0), mode="replicate"), k[:, None, None, :], groups=half * channels)
    x = F.conv2d(F.pad(x, (0, 0, radius, radius), mode="replicate"), k[:, None, :, None], groups=half * channels)
    blurred = x.reshape(half, channels, *images.shape[2:]) + 0.03 * torch.randn(half, channels, *images.shape[2:], generator=gen)
    return torch.cat([blurred, images[half:]]).clamp(0, 1)


def make_batch(seed: int, step: int, batch: int):
    rng = np.random.default_rng([seed, step])
    reqs = [sample_requirements(rng) for _ in range(batch)]
    images = render_batch([sample_scene(r, rng) for r in reqs])
    negatives = [hard_negative(r, rng) for r in reqs]
    gen = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return degrade(images, gen), reqs, negatives


def contrastive_loss(model: TinyCLIP, images, reqs, negatives) -> torch.Tensor:
    img = model.embed_images(images)
    pos = model.embed_texts([caption(r) for r in reqs])
    neg = model.embed_texts([caption(r) for r in negatives])
    scale = model.logit_scale.exp().clamp(max=100)
    ids: dict[tuple, int] = {}
    keys = torch.tensor([ids.setdefault(r.canonical_key(), len(ids)) for r in reqs])
    neg_keys = torch.tensor([ids.setdefault(r.canonical_key(), len(ids)) for r in negatives])
    n = len(reqs)
    same = (keys[:, None] == keys[None, :]) & ~torch.eye(n, dtype=torch.bool)
    same_neg = keys[:, None] == neg_keys[None, :]
    logits_pos = (scale * img @ pos.T).masked_fill(same, float("-inf"))
    logits_neg = (scale * img @ neg.T).masked_fill(same_neg, float("-inf"))
    target = torch.arange(n)
    i2t = F.cross_entropy(torch.cat([logits_pos, logits_neg], dim=1), target)
    t2i = F.cross_entropy((scale * pos @ img.T).masked_fill(same, float("-inf")), target)
    return (i2t + t2i) / 2


@torch.no_grad()
def evaluate(model: TinyCLIP, seed: int, n: int = 800) -> dict:
    """Held-out scenes (a different seed stream): pairwise accuracy true caption vs hard negative."""
    model.eval()
    images, reqs, negatives = make_batch(seed + 10_000, 0, n)
    pos = model.similarity(images, [caption(r) for r in reqs])
    neg = model.similarity(images, [caption(r) for r in negatives])
    out = {"pairwise_accuracy": float((pos > neg).float().mean()), "mean_pos": float(pos.mean()),
           "mean_neg": float(neg.mean()), "per_skill": {}}
    for skill in SKILLS:
        idx = [i for i, r in enumerate(reqs) if r.skill == skill]
        out["per_skill"][skill] = float((pos[idx] > neg[idx]).float().mean())
    model.train()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=96)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--out", type=Path, default=None, help="weights folder (default: solbench/assets)")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = TinyCLIP(TinyCLIPConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def factor(s: int) -> float:
        if s < args.warmup:
            return (s + 1) / args.warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (s - args.warmup) / max(1, args.steps - args.warmup))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    t0, losses = time.perf_counter(), []
    for step in range(args.steps):
        loss = contrastive_loss(model, *make_batch(args.seed, step, args.batch))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
        if (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps} loss {np.mean(losses[-args.log_every:]):.4f} "
                  f"scale {model.logit_scale.exp().item():.1f} {(step + 1) / (time.perf_counter() - t0):.2f} steps/s",
                  flush=True)
    metrics = evaluate(model, args.seed)
    metrics.update(steps=args.steps, batch=args.batch, lr=args.lr, seed=args.seed,
                   final_loss=float(np.mean(losses[-args.log_every:])), train_seconds=time.perf_counter() - t0)
    print(json.dumps(metrics, indent=2))
    out = args.out or asset_path(f"{ASSET_NAME}.json").parent
    out.mkdir(parents=True, exist_ok=True)
    save_tiny_clip(model.eval(), out)
    (out / f"{ASSET_NAME}_metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
