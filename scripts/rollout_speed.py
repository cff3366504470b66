"""One transformer forward of each rollout arm at a spec's shapes: writes rollout_speed.csv and .json (issues 40, 46).

    python scripts/rollout_speed.py --out DIR [--spec experiments/flux_main.yaml] [--tiny] [--repeats 5]
                                    [--budget 240] [--compile auto|on|off] [--arms PLAN] [--inject-failure ARM]

The model is the spec's (FLUX.1 for flux_main) at its published shapes with random weights
(solbench.measure.published), at the spec's resolution, text length, guidance and rollout micro-batch,
with the spec's LoRA (as solbench's PolicyNets builds it: fp32 adapters on the bf16 transformer). Arms:

- ``lora``: the BF16 rollout through peft's unmerged LoRA (the old policy's adapter active);
- ``merged``: the BF16 rollout through the merged rollout copy (model.rollout_copy: merged);
- ``explore``: the explore copy in what ``quant.backend: auto`` takes here (FP8 through torch's scaled
  matmul on Hopper, per-tensor scales, with the spec recipe's layer selection; NVFP4 on Blackwell), as
  solbench doctor --measure builds it;
- ``explore_fast``: the same copy with the FP8 GEMM's fast accumulation (quant.fast_accum; torchao's default);
- ``explore_rowwise``: FP8 with rowwise scales (a scale per token and per output channel, the recipe's layers:
  fp8_rowwise_flux on FLUX) with fast accumulation.

Each arm runs eager or compiled (solbench.models.compile, model.compile's mode; ``--compile auto`` compiles on CUDA
only). The default plan measures what the issues' ratios rest on first: the two FP8 candidates compiled (fast
accumulation, rowwise), then the faster BF16 path compiled, then those three arms eager (seconds each), then the
plain FP8 copy compiled and eager, the LoRA path eager, and last the LoRA path compiled (peft under dynamo: the
slowest and least tried compile). ``--arms`` replaces the
plan (e.g. ``explore_fast:compiled,merged:compiled,merged:eager``). Explore arms whose setting does not apply
here (fast accumulation where the copy is not on torch's FP8 GEMM) are skipped and say why.

Nothing is lost to one arm: each runs in its own try/except and an error is that arm's row (``error``), the
CSV and JSON are rewritten after every arm, a compiled arm whose compilation fell back to eager (solbench.models.compile)
is recorded as that error instead of timing eager code, and an explore copy is built when its first arm starts
and dropped after its last. ``--budget`` starts no arm past that many seconds. ``--inject-failure ARM`` (or
``ARM:compiled``) raises inside that arm: the test of this script's resilience.

Rows: ``arm, precision, compiled, batch, seconds_per_forward, tflops, compile_seconds, error``, where
seconds_per_forward is the median time of one batched call divided by the sample forwards it makes (as
docs/measured/H200.md counts it) and tflops the model's closed-form FLOPs (solbench.models.flops) over that time.
rollout_speed.json adds the speed ratios the issues ask about, what was skipped and the environment.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

COLUMNS = ("arm", "precision", "compiled", "batch", "seconds_per_forward", "tflops", "compile_seconds", "error")
BF16_ARMS = ("lora", "merged")
# explore arm -> (recipe kind, fast accumulation): "spec" is the spec's recipe as backend auto runs it here,
# "rowwise" its FP8 rowwise twin (the same layers)
EXPLORE_ARMS = {"explore": ("spec", False), "explore_fast": ("spec", True), "explore_rowwise": ("rowwise", True)}
ARMS = (*BF16_ARMS, *EXPLORE_ARMS)
DEFAULT_PLAN = ("explore_fast:compiled", "explore_rowwise:compiled", "merged:compiled", "merged:eager",
                "explore_fast:eager", "explore_rowwise:eager", "explore:compiled", "explore:eager", "lora:eager",
                "lora:compiled")


class InjectedFailure(RuntimeError):
    """Raised inside the arm ``--inject-failure`` names."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times


def _first_run(spec: str):
    """The spec's first Sol-RL run (the arms' shapes and LoRA), else its first run."""
    from solbench.spec import load_spec

    runs = [planned.config for planned in load_spec(spec).runs]
    return next((cfg for cfg in runs if cfg.method == "sol_rl"), runs[0])


def parse_plan(text: str | None) -> list[tuple[str, bool]]:
    """``arm:compiled|eager`` items, comma-separated, as (arm, compiled); None: the default plan."""
    plan = []
    for item in (text.split(",") if text else DEFAULT_PLAN):
        arm, _, how = item.strip().partition(":")
        if arm not in ARMS or how not in ("compiled", "eager"):
            raise SystemExit(f"rollout_speed: --arms item {item!r} is not ARM:compiled or ARM:eager "
                             f"(arms: {', '.join(ARMS)})")
        plan.append((arm, how == "compiled"))
    return plan


def rowwise_twin(recipe):
    """``recipe``'s layer selection in FP8 with rowwise scales (per token, per output channel)."""
    from solbench import quant

    recipe = quant.get_recipe(recipe)
    if recipe.format == "fp8" and recipe.rowwise:
        return recipe
    return recipe.replace(name=f"{recipe.name}->fp8_rowwise", format="fp8", weight_block="channel", rowwise=True)


def build(cfg, device: torch.device, tiny: bool):
    """(adapter, nets): the model at the run's shapes with its LoRA roles and the merged rollout copy (trained-looking
    adapters: B != 0, so the LoRA branch computes something), no explore copy and nothing compiled yet."""
    import dataclasses

    from solbench.measure.published import build_adapter
    from solbench.models import default_lora_init
    from solbench.engine.policy import PolicyNets

    adapter = build_adapter(cfg.model.name, device, torch.bfloat16, tiny=tiny,
                            resolution=None if tiny else cfg.model.resolution)
    finetune = cfg.finetune
    if finetune.lora_init is None:
        finetune = dataclasses.replace(finetune, lora_init=default_lora_init(cfg.model.name))
    nets = PolicyNets(adapter.transformer, finetune, {"old"}, explore_source="old", rollout_copy=True)
    with torch.no_grad():
        for p in nets.trainable("old"):
            p.add_(torch.randn_like(p) * 1e-3)
    nets.sync_explore_copy()  # the merged copy from the perturbed adapters
    return adapter, nets


class ExploreCopies:
    """The explore arms' copies, built on first use from the old policy (as PolicyNets builds its explore copy)
    and dropped when no later arm needs them."""

    def __init__(self, cfg, device: torch.device, nets) -> None:
        self.cfg, self.device, self.nets = cfg, device, nets
        self.built: dict[str, tuple] = {}  # arm -> (module, precision label)
        self.notes: list[str] = []

    def setting(self, arm: str):
        """(factory, label, None) for the arm here, or (None, None, why it does not apply)."""
        from solbench.measure.iteration import _explore_fns

        kind, fast = EXPLORE_ARMS[arm]
        recipe = rowwise_twin(self.cfg.quant.recipe) if kind == "rowwise" else None
        notes: list[str] = []
        factory, _, chosen, backend = _explore_fns(self.cfg, self.device, notes, recipe=recipe, fast_accum=fast)
        self.notes += [n for n in notes if n not in self.notes]
        if kind == "spec" and fast and not factory.fast_accum:  # explore_fast would repeat explore (rowwise keeps its arm)
            return None, None, f"fast accumulation does not apply: {chosen.name} is on backend {backend} here"
        return factory, f"{chosen.name} ({backend}{', fast accumulation' if factory.fast_accum else ''})", None

    def get(self, arm: str):
        if arm not in self.built:
            factory, label, why = self.setting(arm)
            if factory is None:
                raise ValueError(why)
            with torch.no_grad(), self.nets._explore_source_view() as source:
                self.built[arm] = (factory(source).requires_grad_(False), label)
        return self.built[arm]

    def release(self, keep: set[str]) -> None:
        for arm in [a for a in self.built if a not in keep]:
            del self.built[arm]
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()


def measure(args, out_dir: Path) -> dict:
    from solbench.models.compile import compile_blocks, on_fallback, resolve_compile, sampling

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = _first_run(args.spec)
    batch = cfg.micro_batch.rollout or 1
    adapter, nets = build(cfg, device, args.tiny)
    per_forward = adapter.flops_per_forward()
    guidance = cfg.sampling.guidance if cfg.sampling.guidance is not None else adapter.default_guidance
    forwards = batch * adapter.forwards_per_velocity(guidance)  # sample forwards per velocity call (CFG: 2 each)
    prompts = [f"a photo of object number {i} on a table" for i in range(batch)]
    with torch.no_grad():
        cond = adapter.encode(prompts)
        x = torch.randn(batch, *adapter.latent_shape, device=device, dtype=torch.bfloat16)
        t = torch.full((batch,), 0.7, device=device)
    mode = resolve_compile(args.compile, device)
    copies = ExploreCopies(cfg, device, nets)
    out = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "torch": torch.__version__,
           "spec": args.spec, "model": cfg.model.name, "latent_shape": list(adapter.latent_shape), "batch": batch,
           "guidance": guidance, "lora_rank": cfg.finetune.lora_rank, "compile_mode": mode, "notes": copies.notes,
           "plan": [f"{a}:{'compiled' if c else 'eager'}" for a, c in args.plan], "rows": [], "compile_seconds": {},
           "skipped": [], "ratios": {}, "seconds": 0.0}
    start = time.perf_counter()
    plan = list(args.plan)
    if mode is None and any(compiled for _, compiled in plan):
        out["skipped"].append(f"compiled arms: model.compile {args.compile!r} compiles nothing on {device.type}")
        plan = [(arm, compiled) for arm, compiled in plan if not compiled]
    for index, (arm, compiled) in enumerate(plan):
        label = f"{arm} {'compiled' if compiled else 'eager'}"
        if time.perf_counter() - start > args.budget:
            out["skipped"].append(f"{label}: past the {args.budget:.0f} s budget")
            continue
        row = None
        try:
            row = _measure_arm(arm, compiled, args, adapter, nets, copies, x, t, cond, guidance, forwards, per_forward,
                               mode, device, (compile_blocks, on_fallback, sampling))
        except _Skip as skip:
            out["skipped"].append(f"{label}: {skip}")
        except Exception as err:  # this arm's row says what went wrong; the others still run
            row = _row(arm, "bf16" if arm in BF16_ARMS else "explore", compiled, batch,
                       error=f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}")
            traceback.print_exc()
        copies.release({a for a, _ in plan[index + 1:] if a in EXPLORE_ARMS})
        if row is not None:
            out["rows"].append(row)
            if row["compile_seconds"] is not None:
                out["compile_seconds"][arm] = row["compile_seconds"]
            print(json.dumps(row), flush=True)
        out["ratios"] = _ratios(out["rows"])
        out["seconds"] = round(time.perf_counter() - start, 1)
        write_outputs(out, out_dir)  # after every arm: a run cut short keeps what it measured
    return out


class _Skip(Exception):
    """An arm that does not apply here (its reason is recorded under ``skipped``)."""


def _row(arm: str, precision: str, compiled: bool, batch: int, seconds: float | None = None, per_forward=None,
         compile_seconds: float | None = None, error: str = "") -> dict:
    return {"arm": arm, "precision": precision, "compiled": compiled, "batch": batch,
            "seconds_per_forward": float(f"{seconds:.4g}") if seconds else None,  # 4 significant digits: tiny shapes too
            "tflops": float(f"{per_forward / seconds / 1e12:.4g}") if seconds and per_forward else None,
            "compile_seconds": compile_seconds, "error": error}


def _measure_arm(arm, compiled, args, adapter, nets, copies, x, t, cond, guidance, forwards, per_forward, mode,
                 device, compiling) -> dict:
    compile_blocks, on_fallback, sampling = compiling
    if arm == "lora":
        module, owner, precision = nets["old"], nets.policy, "bf16 (LoRA)"
    elif arm == "merged":
        module = owner = nets.rollout_copy
        precision = "bf16 (merged)"
    else:
        factory, _, why = copies.setting(arm)
        if factory is None:
            raise _Skip(why)
        module, precision = copies.get(arm)
        owner = module
        if compiled and any(type(m).__name__ == "QuantLinear" for m in module.modules()):
            raise _Skip("an emulated copy is not compiled (solbench.engine.policy)")
    if args.inject_failure in (arm, f"{arm}:{'compiled' if compiled else 'eager'}"):
        raise InjectedFailure(f"--inject-failure {args.inject_failure}")

    def forward():  # compiled blocks run compiled only inside sampling(): an eager arm stays eager after a compiled one
        with torch.no_grad(), (sampling() if compiled else contextlib.nullcontext()):
            return adapter.velocity(module, x, t, cond, guidance)

    compile_seconds = None
    if compiled:
        compile_blocks(owner, mode)
        fell_back = []
        earlier = on_fallback(owner, fell_back.append)
        first = time.perf_counter()
        forward()
        _sync(device)
        compile_seconds = round(time.perf_counter() - first, 1)
        if earlier or fell_back:
            raise RuntimeError(f"compilation fell back to eager: {(earlier or fell_back[0])['error']}")
    else:
        forward()  # warm-up: cuBLAS handles, workspaces
    seconds = statistics.median(_timed(forward, device, args.repeats)) / forwards
    return _row(arm, precision, compiled, x.shape[0], seconds, per_forward, compile_seconds)


def write_outputs(out: dict, out_dir: Path) -> None:
    with (out_dir / "rollout_speed.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(out["rows"])
    (out_dir / "rollout_speed.json").write_text(json.dumps(out, indent=1) + "\n")


def _ratios(rows: list[dict]) -> dict:
    """The issues' speed-ups where both rows exist: each compiled explore arm over the faster compiled BF16 arm
    (LoRA or merged) and the best of them (``best_explore_compiled_vs_best_bf16_compiled``, goal 1.3), each arm
    compiled over eager (goal 1.15 for BF16), and merged over LoRA eager."""
    time_of = {(r["arm"], r["compiled"]): r["seconds_per_forward"] for r in rows if r["seconds_per_forward"]}
    ratios = {}
    bf16_compiled = [time_of[(a, True)] for a in BF16_ARMS if (a, True) in time_of]
    explore_compiled = {a: time_of[(a, True)] for a in EXPLORE_ARMS if (a, True) in time_of}
    if bf16_compiled:
        for arm, seconds in explore_compiled.items():
            ratios[f"{arm}_compiled_vs_best_bf16_compiled"] = round(min(bf16_compiled) / seconds, 3)
        if explore_compiled:
            ratios["best_explore_compiled_vs_best_bf16_compiled"] = round(
                min(bf16_compiled) / min(explore_compiled.values()), 3)
    for arm in ARMS:
        if (arm, True) in time_of and (arm, False) in time_of:
            ratios[f"{arm}_compiled_vs_eager"] = round(time_of[(arm, False)] / time_of[(arm, True)], 3)
    if ("merged", False) in time_of and ("lora", False) in time_of:
        ratios["merged_vs_lora_eager"] = round(time_of[("lora", False)] / time_of[("merged", False)], 3)
    return ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="folder for rollout_speed.csv and rollout_speed.json")
    parser.add_argument("--spec", default="experiments/flux_main.yaml", help="the spec whose Sol-RL run gives the shapes")
    parser.add_argument("--tiny", action="store_true", help="the published model's tiny shapes (the CPU test)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per arm (after one warm-up)")
    parser.add_argument("--budget", type=float, default=240.0, help="start no arm after this many seconds")
    parser.add_argument("--compile", default="auto", help="model.compile for the compiled arms (auto: CUDA only)")
    parser.add_argument("--arms", default=None, help=f"ARM:compiled|eager, comma-separated, in order (default: "
                                                     f"{','.join(DEFAULT_PLAN)})")
    parser.add_argument("--inject-failure", default=None, metavar="ARM[:compiled|eager]",
                        help="raise inside this arm (tests the script's resilience)")
    args = parser.parse_args()
    args.plan = parse_plan(args.arms)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    result = measure(args, out_dir)
    failed = [r["arm"] for r in result["rows"] if r["error"]]
    print(f"rollout_speed: {len(result['rows'])} rows ({len(failed)} failed), {result['ratios']} "
          f"({result['seconds']} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
