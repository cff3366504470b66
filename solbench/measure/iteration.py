"""`solbench doctor SPEC --measure`: one real iteration of each of a spec's methods at true shapes.

For each method of the spec (Sol-RL and naive BF16 scaling first, then the others in the spec's
order, while the time budget lasts) the spec's first run of that method is measured as one rank:
its model and reward models at their published shapes with random weights (solbench.measure.published),
its micro-batches, sampler settings, LoRA, gradient checkpointing and CPU offload as the spec has
them, one prompt group (world size 1), one training iteration through the real Trainer. Per phase:
seconds, FLOPs, the peak memory (``torch.cuda.max_memory_allocated`` on a GPU, the phase's own
allocations on CPU), beside the doctor's itemised prediction for that phase and the cost
projection's seconds per forward. The explore copy uses what ``quant.backend: auto`` picks here;
a recipe whose format the GPU lacks (NVFP4 on Hopper) is measured in FP8 with the same layer
selection, and the result says so.

Left out, by construction: the other ranks (no gathers or gradient all-reduce), the other 47 prompt
groups of an iteration (phase times scale with images; a rank's per-phase peak does not, past one
micro-batch), evaluation, checkpoint writing, and the time to load real weights.

Every timed phase must do its work; solbench.measure.work says how that is made so and checked.
"""

from __future__ import annotations

import dataclasses
import gc
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from solbench.measure.work import UntiedReward, did_work, fingerprint
from solbench.engine.timing import PhaseTimer

__all__ = ["MeasuringTimer", "measure_spec", "predicted_items", "predicted_phase_gb", "PRIORITY"]

PRIORITY = ("sol_rl", "naive_scaling")  # measured first: the paper's headline comparison
PROMPTS = ["a photo of a red fox sitting in fresh snow", "an empty prompt-free street at night"]


class MeasuringTimer(PhaseTimer):
    """A PhaseTimer that also records each phase's peak memory, in bytes, on ``device``.

    CUDA: the allocator's peak over the phase (nested phases included: an inner phase's reset of the
    peak statistic is folded back into the outer one). CPU: the bytes the phase allocated at its peak
    (solbench.measure.peak.PeakMemory), not counting what existed before it.
    """

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.log: list[tuple] = []  # (PhaseRecord, peak bytes), every phase, in completion order
        self.failed: str | None = None  # the innermost phase an exception left, once one has
        self._stack: list[list[int]] = []

    @contextmanager
    def phase(self, name: str, **kw):
        try:
            with self._measured(name, **kw) as record:
                yield record
        except BaseException:
            self.failed = self.failed or name  # the innermost phase sees the exception first
            raise

    @contextmanager
    def _measured(self, name: str, **kw):
        with super().phase(name, **kw) as record:
            if self.device.type == "cuda":
                if self._stack:
                    self._stack[-1][0] = max(self._stack[-1][0], torch.cuda.max_memory_allocated(self.device))
                torch.cuda.reset_peak_memory_stats(self.device)
                self._stack.append([0])
                try:
                    yield record
                finally:
                    # a CUDA error (an illegal address) raises here too: the phase is then not logged
                    torch.cuda.synchronize(self.device)
                    peak = max(self._stack.pop()[0], torch.cuda.max_memory_allocated(self.device))
                    if self._stack:
                        self._stack[-1][0] = max(self._stack[-1][0], peak)
                    self.log.append((record, peak))
            else:
                from solbench.measure.peak import PeakMemory

                with PeakMemory(self.device) as meter:
                    yield record
                self.log.append((record, meter.bytes))


@dataclass
class MethodMeasurement:
    method: str
    run_id: str
    recipe: str = ""
    backend: str = ""
    notes: list[str] = field(default_factory=list)
    setup_s: float = 0.0
    iteration_s: float = 0.0
    phases: list[dict] = field(default_factory=list)
    predicted: dict = field(default_factory=dict)
    error: str = ""
    context_lost: bool = False  # the error left the CUDA context unusable (solbench.measure.iteration)
    trained: bool | None = None  # a trainable parameter changed in the iteration (None: the iteration failed first)


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _method_runs(spec_path, methods: list[str] | None) -> list:
    """The spec's first run of each method, Sol-RL and naive scaling first."""
    from solbench.spec import load_spec

    first = {}
    for planned in load_spec(spec_path).runs:
        first.setdefault(planned.config.method, planned.config)
    order = [m for m in PRIORITY if m in first] + [m for m in first if m not in PRIORITY]
    if methods:
        unknown = sorted(set(methods) - set(first))
        if unknown:
            from solbench.errors import ConfigError

            raise ConfigError(f"--methods: {', '.join(unknown)} not in {spec_path} (it runs {', '.join(order)})")
        order = [m for m in order if m in methods]
    return [first[m] for m in order]


def _explore_fns(cfg, device: torch.device, notes: list[str], *, recipe=None, fast_accum: bool | None = None):
    """(factory, sync, recipe, backend) for the run's explore copy on this machine: backend auto, and
    the recipe's FP8 twin (same layers) where the GPU lacks the recipe's FP4 format.

    ``recipe`` (a name or QuantRecipe) replaces the run's quant.recipe; ``fast_accum`` (default: the run's
    quant.fast_accum) turns on the FP8 GEMM's fast accumulation where the copy runs on torch's scaled matmul
    (solbench.quant.native.set_fast_accum), as trainer_setup.quant_explore_fns does for a run; elsewhere it
    is left off and ``notes`` says so. Layers of the copy that read one tensor quantize it once
    (quantized_copy's share_input_quantization)."""
    from solbench import quant
    from solbench.quant.backends import choose_backend
    from solbench.quant.native import set_fast_accum

    recipe = quant.get_recipe(cfg.quant.recipe if recipe is None else recipe)
    fast_accum = cfg.quant.fast_accum if fast_accum is None else fast_accum
    choice = choose_backend(recipe, "auto", allow_emulated_fallback=True, device=device)
    if choice.backend == "emulated" and device.type == "cuda" and recipe.format != "fp8":
        twin = recipe.replace(name=f"{recipe.name}->fp8", format="fp8", weight_block=None)
        fp8 = choose_backend(twin, "auto", allow_emulated_fallback=True, device=device)
        if fp8.backend != "emulated":
            notes.append(f"{recipe.format.upper()} is not native here ({'; '.join(choice.passed_over.values())}): "
                         f"explored in FP8 with {recipe.name}'s layer selection")
            recipe, choice = twin, fp8
    if choice.passed_over:
        notes.append(choice.describe())
    chosen = recipe  # the backend goes beside it (quantized_copy's backend)
    if fast_accum and (choice.backend != "torch" or chosen.format != "fp8"):
        notes.append(f"fast accumulation not applied: {chosen.name} runs {chosen.format} on backend {choice.backend}, "
                     "and only backend torch's FP8 GEMM has it")
        fast_accum = False

    def factory(module):
        copy = quant.quantized_copy(module, chosen, backend=choice.backend)
        if choice.backend == "torch":
            set_fast_accum(copy, bool(fast_accum))
        return copy

    factory.fast_accum = bool(fast_accum)
    return factory, quant.sync_weights, chosen, choice.backend


def _measure_run(cfg, *, device: torch.device, tiny: bool, rewards: dict, workdir: Path) -> MethodMeasurement:
    from solbench.measure.published import build_adapter
    from solbench.method import get_method
    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    result = MethodMeasurement(cfg.method, cfg.run_id)
    prompts = workdir / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    run = dataclasses.replace(cfg, world_size=1, prompts_per_iter=1, iterations=1, device=device.type,
                              train_prompts=str(prompts), eval=dataclasses.replace(cfg.eval, prompts=str(prompts),
                                                                                  n_prompts=None))
    if tiny:  # the tiny shapes' own resolution
        run = dataclasses.replace(run, model=dataclasses.replace(run.model, resolution=None))
    start = time.perf_counter()
    adapter = build_adapter(run.model.name, device, torch.bfloat16, tiny=tiny, resolution=run.model.resolution,
                            cpu_offload=run.model.cpu_offload)
    if run.model.gradient_checkpointing:
        adapter.transformer.enable_gradient_checkpointing()
    explore = None
    if "explore" in get_method(run.method).nets:
        factory, sync, recipe, backend = _explore_fns(run, device, result.notes)
        explore, result.recipe, result.backend = (factory, sync), recipe.name, backend
    trainer = Trainer(run, RunStore(workdir / run.run_id, run.run_id), explore=explore, adapter=adapter,
                      reward_models={k: v for k, v in rewards.items() if k in {*run.rewards, *run.eval.rewards}})
    timer = MeasuringTimer(device)
    timer.step = 1
    trainer.timer = trainer.engine.timer = timer
    result.setup_s = time.perf_counter() - start
    result.predicted = predicted_items(cfg, recipe.format if explore is not None else None)
    start = time.perf_counter()
    trainer.step = 1
    before = fingerprint(trainer.params)
    try:
        trainer.train_iteration()
        result.trained = not torch.equal(before, fingerprint(trainer.params))
    except Exception as err:  # what ran until then is still reported, with the phase that failed
        what = "out of GPU memory" if isinstance(err, torch.cuda.OutOfMemoryError) else type(err).__name__
        result.error = f"{what} in phase {timer.failed or '?'}: {_first_line(err)}"
        result.context_lost = _cuda_context_lost(err)
    result.iteration_s = time.perf_counter() - start
    per_forward = adapter.flops_per_forward()
    for record, peak in timer.log:
        forwards = record.flops / per_forward if record.flops and per_forward else None
        result.phases.append({
            "phase": record.phase, "precision": record.precision, "seconds": round(record.seconds, 4),
            "n_images": record.n_images, "flops": record.flops,
            "forward_equivalents": round(forwards, 2) if forwards else None,
            "seconds_per_forward": round(record.seconds / forwards, 5) if forwards else None,
            "peak_gb": round(peak / 1e9, 6),
            "predicted_gb": predicted_phase_gb(result.predicted, record.phase),
        })
        result.phases[-1]["did_work"] = did_work(result.phases[-1], result.trained)
    del trainer, adapter
    gc.collect()
    if device.type == "cuda" and not result.context_lost:
        torch.cuda.empty_cache()
    return result


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def _cuda_context_lost(err: BaseException) -> bool:
    """Whether ``err`` leaves this process's CUDA context unusable (an illegal address, a device-side
    assert): every later CUDA call fails, so no other method can be measured in this process."""
    text = str(err)
    return type(err).__name__ == "AcceleratorError" or any(
        s in text for s in ("illegal memory access", "device-side assert", "unspecified launch failure"))


def predicted_items(cfg, explore_format: str | None) -> dict[str, float]:
    """The doctor's itemised GB for the spec's run ``cfg`` (solbench.doctor.memory_items), its explore copy
    in ``explore_format`` (the format measured: FP8 where the GPU lacks NVFP4); {} without a profile."""
    from solbench.doctor import memory_items, run_profile

    profile = run_profile(cfg.to_dict())
    if profile is None:
        return {}
    if explore_format is not None:
        profile = dataclasses.replace(profile, formats=frozenset({explore_format.upper()}))
    return {name.split(":")[0]: gb for name, gb in memory_items(profile)}


# Which of the doctor's activation items a phase's peak holds (besides every weights item).
_PHASE_ACTIVATIONS = {"explore": ("activations/rollout", "activations/decode"),
                      "regenerate": ("activations/rollout", "activations/decode"),
                      "rollout": ("activations/rollout", "activations/decode"),
                      "eval": ("activations/rollout", "activations/decode"),
                      "reward": ("activations/reward",), "train": ("activations/train",),
                      "select": (), "sync": ()}


def predicted_phase_gb(items: dict, phase: str) -> float | None:
    """The doctor's allocated GB during ``phase``: every weights item plus the phase's largest
    activation item (its CUDA-context and fragmentation overhead is not allocated memory)."""
    if not items:
        return None
    weights = sum(gb for name, gb in items.items() if name.startswith(("weights/", "caches/")))
    acts = [items.get(name, 0.0) for name in _PHASE_ACTIVATIONS.get(phase, ())]
    return round(weights + max(acts, default=0.0), 1)


def projected_seconds_per_forward(model: str, resolution: int | None, hardware: str, low_precision: bool) -> float:
    """The cost projection's seconds for one transformer forward of one image (solbench.measure.paper_models'
    closed-form FLOPs, a hardware profile's dense peaks and the paper setting's utilisation, solbench.report.cost)."""
    from solbench.measure.paper_models import forward_flops
    from solbench.report.cost import PaperSetting
    from solbench.report.hardware import get_hardware

    hw, setting = get_hardware(hardware), PaperSetting()
    f = forward_flops(model, resolution)
    bf16 = hw.bf16 * 1e15
    quantized = f.quantized if (low_precision and f.quantized is not None) else (f.linear if low_precision else 0.0)
    low = hw.explore_peak()[0] * 1e15
    return (quantized / (low * setting.mfu) + (f.linear - quantized) / (bf16 * setting.mfu)
            + f.attention / (bf16 * setting.attention_mfu))


def _hardware_profile() -> str | None:
    if not torch.cuda.is_available():
        return None
    major, _ = torch.cuda.get_device_capability()
    return "B200" if major >= 10 else ("H100" if major == 9 else None)


def measure_spec(spec_path, out_dir, *, tiny: bool = False, budget_s: float = 480.0,
                 methods: list[str] | None = None, device: torch.device | str | None = None,
                 isolate: bool = False, configure=None) -> dict:
    """Measure one iteration per method of ``spec_path`` here; write measure.json and measure.md to
    ``out_dir`` and return the JSON. Stops starting methods when the next would overrun ``budget_s``.

    ``isolate``: each method in its own process (`solbench doctor SPEC --measure --methods M`), so an
    error that leaves the CUDA context unusable ends that method's row only; without it such an error
    leaves the remaining methods out, saying why. ``configure(cfg) -> cfg`` changes each method's run before it is
    measured (the tests' smaller sizes; not with ``isolate``, whose children read the spec themselves)."""
    from solbench.measure.table import write_outputs

    start = time.perf_counter()
    runs = _method_runs(spec_path, methods)
    if configure is not None:
        if isolate:
            raise ValueError("measure_spec: configure changes runs in this process; isolated children would not see it")
        runs = [configure(cfg) for cfg in runs]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if isolate:  # this process touches no GPU: the children's peaks and memory are their own
        device, rewards = None, {}
    else:
        device = torch.device(device) if device is not None else _device()
        rewards = _rewards(runs, device, tiny)
    result = {
        "spec": str(spec_path), "tiny": tiny, "device": _device_name(device) if device else None,
        "torch": torch.__version__, "hardware_profile": _hardware_profile() if device else None,
        "budget_s": budget_s, "isolated": isolate, "elapsed_s": 0.0, "methods": [], "left_out": [],
        "not_measured": ["other ranks: gathers and the gradient all-reduce (one GPU, world size 1)",
                         "the other prompt groups of an iteration (one group; phase times scale with images)",
                         "evaluation, checkpoints, loading real weights",
                         "TransformerEngine where it is not installed (backend auto's choice is recorded)"],
    }
    last, lost = 0.0, None
    with tempfile.TemporaryDirectory(prefix="solbench_measure_runs.") as workdir:  # run stores, not outputs
        for cfg in runs:
            elapsed = time.perf_counter() - start
            if lost is not None:
                why = f"the CUDA context was lost in {lost}'s run (its error); measure with --isolate"
                result["left_out"].append({"method": cfg.method, "why": why})
                continue
            if elapsed + last > budget_s:
                why = f"time budget: {elapsed:.0f} s spent, the last method took {last:.0f} s, budget {budget_s:.0f} s"
                result["left_out"].append({"method": cfg.method, "why": why})
                continue
            t0 = time.perf_counter()
            if isolate:
                measured, child = _measure_in_child(spec_path, cfg, tiny=tiny, workdir=Path(workdir))
                for key in ("device", "hardware_profile", "torch"):
                    result[key] = result[key] if child.get(key) is None else child[key]
            else:
                try:
                    measured = _measure_run(cfg, device=device, tiny=tiny, rewards=rewards, workdir=Path(workdir))
                except Exception as err:  # one method's failure (e.g. out of memory building it) is its row
                    measured = MethodMeasurement(cfg.method, cfg.run_id,
                                                 error=f"{type(err).__name__}: {_first_line(err)}",
                                                 context_lost=_cuda_context_lost(err))
                    gc.collect()
                    if device.type == "cuda" and not measured.context_lost:
                        torch.cuda.empty_cache()
                if measured.context_lost:
                    lost = cfg.method
                _add_projection(measured, cfg, result["hardware_profile"], tiny)
            last = time.perf_counter() - t0
            result["methods"].append(dataclasses.asdict(measured))
            result["elapsed_s"] = round(time.perf_counter() - start, 1)
            write_outputs(result, out_dir)  # after every method: a run cut short keeps what it measured
    result["elapsed_s"] = round(time.perf_counter() - start, 1)
    write_outputs(result, out_dir)
    return result


def _rewards(runs, device: torch.device, tiny: bool) -> dict:
    from solbench.measure.published import build_rewards

    names = sorted({name for cfg in runs for name in (*cfg.rewards, *cfg.eval.rewards)})
    rewards = build_rewards(names, device, tiny=tiny)
    for reward in rewards.values():
        if callable(getattr(reward, "load", None)):
            reward.load()
    return {name: UntiedReward(reward) for name, reward in rewards.items()}


def _measure_in_child(spec_path, cfg, *, tiny: bool, workdir: Path) -> tuple[MethodMeasurement, dict]:
    """One method measured by `solbench doctor SPEC --measure --methods M` in a child process: its row, and
    the child's whole result (or {} if it wrote none: the row then carries the end of its output)."""
    import json
    import subprocess
    import sys

    out = workdir / f"child_{cfg.method}"
    # the child runs as this process does: its interpreter flags (-S, -P, ...) and environment
    cmd = [sys.executable, *subprocess._args_from_interpreter_flags(), "-m", "solbench", "doctor", str(spec_path),
           "--measure", "--methods", cfg.method, "--budget", "1e9", "--out", str(out)] + (["--tiny"] if tiny else [])
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(proc.stdout, end="", flush=True)  # the child's table and any traceback go to this process's log
    path = out / "measure.json"
    child = json.loads(path.read_text()) if path.is_file() else {}
    rows = [m for m in child.get("methods", []) if m["method"] == cfg.method]
    if rows:
        fields = {f.name for f in dataclasses.fields(MethodMeasurement)}
        return MethodMeasurement(**{k: v for k, v in rows[0].items() if k in fields}), child
    tail = " | ".join(proc.stdout.strip().splitlines()[-3:])[-300:]
    return MethodMeasurement(cfg.method, cfg.run_id, error=f"its process exited {proc.returncode} without a "
                                                             f"result: {tail}"), child


def _add_projection(measured: MethodMeasurement, cfg, hardware: str | None, tiny: bool) -> None:
    """The cost projection's seconds per forward beside each sampling phase's measured one."""
    if not hardware or tiny:
        return
    for row in measured.phases:
        if row["seconds_per_forward"] and row["phase"] in ("explore", "regenerate", "rollout"):
            low = bool(measured.recipe) and row["phase"] == "explore"
            row["projected_seconds_per_forward"] = round(projected_seconds_per_forward(
                cfg.model.name, cfg.model.resolution, hardware, low), 5)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} (sm_{major}{minor})"
    import platform

    return f"CPU ({platform.processor() or platform.machine()})"

