"""`solbench sample`: a PNG grid of generated images, one row per prompt and one column per seed.

Seeds are candidate indices in the noise stream "eval" (by default), so the same prompt and seed
give the same image here, in `solbench eval` and in a run's evaluation. With ``--precision explore``
the images come from the low-precision (quantized) copy of the model, from the same noise.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from solbench.config import ModelConfig, QuantConfig
from solbench.errors import ConfigError

HELP = "generate a grid PNG of images for prompts x seeds"


def parse_seeds(text: str) -> list[int]:
    """ "0-7" -> 0..7, "0,3,9" -> [0, 3, 9], "4" -> a single seed; ranges and lists combine."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part[1:]:
                lo, hi = part.split("-", 1) if not part.startswith("-") else (part, "")
                lo_i, hi_i = int(lo), int(hi)
                if hi_i < lo_i:
                    raise ValueError
                seeds.extend(range(lo_i, hi_i + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise ConfigError(f"--seeds: cannot read {text!r}; use a range like 0-7 or a list like 0,3,5") from None
    if not seeds or min(seeds) < 0:
        raise ConfigError(f"--seeds: need non-negative seeds, got {text!r}")
    return seeds


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by `sample` and `eval`: the model, sampler and precision."""
    g = parser.add_argument_group("model and sampler")
    g.add_argument("--model", default="tiny", help="model name: tiny | flux | sd3 | sana (default tiny)")
    g.add_argument("--model-path", default=None,
                   help="local folder or Hugging Face id of the weights; for tiny: 'random' = untrained init")
    g.add_argument("--resolution", type=int, default=None, help="image side in pixels (default: the model's)")
    g.add_argument("--steps", type=int, default=10, help="sampling steps (default 10)")
    g.add_argument("--sampler", default="euler",
                   help="euler | dpm2 | flowgrpo_sde | flowgrpo_cps | dance_sde | awm_sde (default euler)")
    g.add_argument("--noise-level", type=float, default=0.0, help="SDE noise level (a, eta or tau)")
    g.add_argument("--guidance", type=float, default=None, help="CFG / distilled guidance (default: the model's)")
    g.add_argument("--shift", type=float, default=None, help="sigma-schedule shift (default: the model's)")
    g.add_argument("--precision", choices=("full", "explore"), default="full",
                   help="full: the model in its full dtype; explore: its quantized copy")
    g.add_argument("--recipe", default=QuantConfig().recipe, help="quantization recipe for --precision explore")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    g.add_argument("--run-seed", type=int, default=0, help="run seed the noise derives from (default 0)")
    g.add_argument("--stream", default="eval", help="noise stream (default eval)")


def build_engine(args, rewards=None):
    """(engine, sampler spec, role) for the model/sampler/precision arguments."""
    from solbench.engine.engine import Engine
    from solbench.models import build_adapter
    from solbench.engine.sampling import SamplerSpec
    from solbench.engine.timing import PhaseTimer

    device = resolve_device(args.device)
    adapter = build_adapter(ModelConfig(name=args.model, path=args.model_path, resolution=args.resolution), device)
    nets = {"policy": adapter.transformer}
    recipe = None
    if args.precision == "explore":
        from solbench.quant import get_recipe, quantized_copy

        recipe = get_recipe(args.recipe)
        nets["explore"] = quantized_copy(adapter.transformer, recipe)
    spec = SamplerSpec(args.sampler, args.steps, args.noise_level, args.guidance, args.shift)
    engine = Engine(adapter, nets, rewards, PhaseTimer(), args.run_seed, device, explore_recipe=recipe)
    return engine, spec, ("explore" if args.precision == "explore" else "policy")


def image_grid(images: torch.Tensor, rows: int, cols: int, *, scale: int = 1, pad: int = 2) -> torch.Tensor:
    """uint8 HWC grid of images [rows*cols, 3, H, W] in [0, 1], row-major, nearest-upscaled."""
    if images.shape[0] != rows * cols:
        raise ValueError(f"image_grid: {images.shape[0]} images for a {rows}x{cols} grid")
    imgs = images.detach().float().cpu().clamp(0, 1)
    if scale > 1:
        imgs = imgs.repeat_interleave(scale, dim=2).repeat_interleave(scale, dim=3)
    _, c, h, w = imgs.shape
    grid = torch.ones(c, rows * (h + pad) + pad, cols * (w + pad) + pad)
    for i in range(rows * cols):
        r, k = divmod(i, cols)
        top, left = pad + r * (h + pad), pad + k * (w + pad)
        grid[:, top: top + h, left: left + w] = imgs[i]
    return (grid * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()


def save_png(grid: torch.Tensor, path: Path) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid.numpy()).save(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", nargs="+", help="prompt texts (one grid row each)")
    src.add_argument("--prompt-set", help="a prompt set name (shapes/eval) or a .txt/.jsonl file")
    parser.add_argument("--n-prompts", type=int, default=8, help="rows taken from --prompt-set (default 8)")
    parser.add_argument("--seeds", default="0-7", help="seed indices: a range 0-7 or a list 0,3,5 (default 0-7)")
    parser.add_argument("--out", type=Path, default=Path("grid.png"), help="output PNG (default grid.png)")
    parser.add_argument("--scale", type=int, default=None,
                        help="nearest-neighbour upscale of each image (default: up to 128 px)")
    add_model_arguments(parser)


def main(args) -> int:
    seeds = parse_seeds(args.seeds)
    if args.prompts:
        prompt_ids, prompts = list(args.prompts), list(args.prompts)  # the text is the id: stable noise
    else:
        from solbench.world.prompts import load_prompt_set

        records = load_prompt_set(args.prompt_set)[: args.n_prompts]
        prompt_ids, prompts = [r.id for r in records], [r.text for r in records]
    engine, spec, role = build_engine(args)
    ids = [p for p in prompt_ids for _ in seeds]
    texts = [p for p in prompts for _ in seeds]
    cands = [s for _ in prompts for s in seeds]
    rollout = engine.sample(ids, texts, cands, net=role, sampler=spec, phase="eval", stream=args.stream)
    side = rollout.images.shape[-1]
    scale = args.scale or max(1, 128 // side)
    save_png(image_grid(rollout.images, len(prompts), len(seeds), scale=scale), args.out)
    seconds = sum(r.seconds for r in engine.timer.drain())
    print(f"wrote {args.out}: {len(prompts)} prompts x {len(seeds)} seeds, {args.model} {spec.kind} "
          f"{spec.steps} steps, precision {rollout.precision} ({rollout.dtype}), {seconds:.2f} s")
    return 0
