"""The resolved configuration of ONE run: the contract between specs, the launcher and the trainer.

An experiment spec (YAML, solbench.spec) expands into a list of RunConfig objects; each one is
everything a run needs, fully resolved (no defaults left to fill in later), so that the run id, a
short hash of its canonical JSON (launch fields excluded), identifies the run's results exactly.

Field defaults here are those of the embedded world on CPU; the real-model specs in experiments/ set
the paper's values explicitly. Method hyperparameters live in each method's own Config dataclass
(``method_config`` holds its fields by name: built and checked by the method registry at expansion,
solbench.method.build_method_settings).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class ModelConfig:
    name: str = "tiny"  # model registry key: tiny | flux | sd3 | sana
    path: str | None = None  # local directory or Hugging Face id; None = the model's default
    resolution: int | None = None  # image side in pixels; None = the model's native default
    full_dtype: str = "auto"  # "full" precision dtype: auto = bfloat16 on CUDA, float32 on CPU
    gradient_checkpointing: bool = False
    cpu_offload: bool = False  # offload frozen parts (text encoders, VAE) between uses
    # text-encoder tokens per prompt (T5 for FLUX and SD3, Gemma for SANA); None = the model's default, the
    # Sol-RL reference's: 128 for FLUX and SD3 (train_flux1.py / train_sd3.py TEXT_ENCODER_MAX_SEQ_LEN), 300 for SANA
    text_max_length: int | None = None
    # SANA only: prepend SanaPipeline's "complex human instruction" to every prompt (the pipeline's __call__
    # default); False = the prompt alone, as Sol-RL's train_sana.py encodes it (encode_prompt's default);
    # None = the model's default (False)
    prompt_instruction: bool | None = None
    # a native (non-diffusers) transformer checkpoint, a file or "<repo id>/<file>" in the Hugging Face cache;
    # SANA: the linear-FFN SANA 1.6B of Sol-RL's configs/sol_rl/sana.py (SANA_LinearFFN.pth), loaded into a
    # SanaTransformer2DModel whose feed-forward is Linear (solbench.models.sana_linear); None = model.path's own
    checkpoint: str | None = None
    # rollout forwards under torch.compile (solbench.models.compile: each repeated transformer block, sampling only):
    # auto = on for CUDA, off on CPU; on; off; or a torch.compile mode ("max-autotune-no-cudagraphs", the reference's)
    compile: str = "auto"
    # what full-precision rollouts of the method's rollout role sample through (solbench.train.rollout_copy): "merged",
    # a copy with that role's LoRA merged (the reference's inference copy, refreshed after every update, phase
    # "sync"); "lora", the shared transformer with the role's adapter; auto = merged where the doctor's memory
    # model says it fits the GPU, lora on CPU. The run writes what it took to rollout.json
    rollout_copy: str = "auto"


@dataclass
class FinetuneConfig:
    mode: str = "lora"  # lora | full
    lora_rank: int = 32
    lora_alpha: int = 64
    lora_targets: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    lr: float = 3e-4
    weight_decay: float = 1e-4
    adam_betas: tuple[float, float] = (0.9, 0.999)
    grad_clip: float = 1.0
    grad_accum: int = 1  # micro-batches accumulated per optimizer step, per rank (x world_size in all)
    # optimizer steps per iteration (per rollout batch): the iteration's micro-batches split into this
    # many consecutive groups, one step each, so later groups train off-policy (FlowGRPO SD3: 2,
    # DanceGRPO: one per 4 samples); None = one step per grad_accum micro-batches. Needs grad_accum 1.
    optimizer_steps: int | None = None
    ema_decay: float = 0.9  # EMA of trained weights used for evaluation
    # the evaluation EMA updates after optimizer step n only when (n + 1) % ema_every == 0, with the warm-up
    # decay min(ema_decay, (1 + n) / (10 + n)) of flow_grpo's EMAModuleWrapper(update_step_interval=...)
    ema_every: int = 1
    # LoRA initialisation: "gaussian" (A ~ N(0, 1/r), B = 0: every reference's init_lora_weights="gaussian"),
    # "kaiming" (PEFT's default, Kaiming-uniform A), or None = the model's default (solbench.models.default_lora_init:
    # gaussian on FLUX, SD3 and SANA; kaiming on the tiny model, whose shipped results were made with it)
    lora_init: str | None = None


#: model.rollout_copy's values (solbench.train.rollout_copy).
ROLLOUT_COPY_SETTINGS = ("auto", "merged", "lora")


@dataclass
class QuantConfig:
    # named recipe in solbench.quant.RECIPES; the default is the embedded world's explore recipe, FLUX.1's rule
    # scaled to the tiny model (99.5 % of its linear MACs in NVFP4; "nvfp4_tiny", SANA's rule, is the alternative)
    recipe: str = "nvfp4_tiny_flux"
    # emulated | te | torch (torch's scaled matmul, no TE) | cpu_bf16 | auto (the default: te, else torch on a GPU
    # with the format's tensor cores, else cpu_bf16 on a CPU with bf16 units, else emulation with its reason logged);
    # solbench.quant.backends; the run records its choice in explore.json
    backend: str = "auto"
    # with backend te/torch/auto: fall back to emulation instead of failing. Unset (None): on for auto, off for a
    # backend named explicitly (``emulated_fallback``); hashed as that value, so an explicit backend's run id is the
    # one it had when the default was False
    allow_emulated_fallback: bool | None = None
    # backend torch, FP8: the scaled GEMM's fast accumulation (use_fast_accum; scripts/gpu_check.py measures its error)
    fast_accum: bool = False

    @property
    def emulated_fallback(self) -> bool:
        """Whether the explore copy may fall back to emulation: the flag where set, else on for ``auto`` only."""
        return emulated_fallback(self.backend, self.allow_emulated_fallback)


def emulated_fallback(backend: str | None, allow: bool | None) -> bool:
    """``quant.allow_emulated_fallback`` as it applies: ``allow`` where set, else True for backend auto only."""
    return bool(allow) if allow is not None else backend == "auto"


@dataclass
class SamplingConfig:
    steps: int = 10  # full rollout step budget
    shift: float | None = None  # sigma-schedule shift; None = the model's default
    # CFG / distilled guidance scale of rollouts, every loss forward and eval; None = the model's default
    # (SD3.5/SANA: CFG 4.5, FLUX.1-dev: distilled 3.5, tiny: none), 1.0 = no CFG (one forward per velocity)
    guidance: float | None = None
    eval_steps: int = 10


@dataclass
class MicroBatchConfig:
    """How many samples go through a network at once, per rank: a memory bound, not a result.

    On CPU the results are bit-identical whatever these are (solbench.models.batch_invariance); on GPUs they
    change only the summation order. None at expansion takes the model's default
    (solbench.models.MICRO_BATCH_DEFAULTS: the tiny model runs whole batches, the real models sizes
    that fit a B200 and an H100 at their native resolution, see docs/real-models.md).
    """

    rollout: int | None = None  # candidates per transformer call while sampling (Engine micro_batch)
    reward: int | None = None  # images per reward-model call (training and evaluation rewards)
    train: int | None = None  # samples per training forward/backward: the method's micro_batch_size


@dataclass
class EvalConfig:
    every: int = 5  # evaluate every E iterations (and at step 0 and at the end)
    prompts: str = "shapes/eval"  # prompt set name
    n_prompts: int | None = None  # first n prompts of the set; None = all
    seeds_per_prompt: int = 2  # fixed eval seeds (stream "eval")
    rewards: list[str] = field(default_factory=lambda: ["shapes_geneval", "shapes_geneval_strict"])
    use_ema: bool = True
    grid_prompts: int = 8  # prompts shown in the saved sample grid
    # The rest of the evaluation protocol (the real specs state one per model, the same for every method, whatever
    # each trains with; solbench.provenance checks it); None = the run's training setting: sampling.guidance,
    # model.resolution and sampling.shift (the schedule's shift None: the model scheduler's own at that resolution)
    guidance: float | None = None  # CFG / distilled guidance scale of the evaluation samples
    resolution: int | None = None  # image side of the evaluation samples in pixels
    shift: float | None = None  # sigma-schedule shift of the evaluation samples
    sampler: Literal["euler", "dpm2"] = "euler"  # the deterministic ODE solver of the evaluation samples
    # methods with an explore copy: the seeds they train on sampled at the other precision too, and the distance of
    # the samples and of the loss gradient logged (split explore_gap, solbench.train.explore_gap) at iteration 1, every
    # this many iterations and the last; untimed, and it never changes the training; 0 = not measured
    explore_gap_every: int = 0


@dataclass
class NumericsConfig:
    """What, besides the method and its data, decides the numbers a run computes: part of the run id.

    On CPU a GEMM or a reduction split over 2 threads adds in another order than over 1, so a run's
    intra-op thread count is a setting of the run, never derived from the machine: not from its cores,
    its load, ``--workers`` or how many runs are left (solbench.machine.threads). The default, 1, is what one
    run per core gives on any machine. A run whose setting cannot be had (fewer cores than
    ``threads``, a Slurm task with fewer CPUs) says so in one line and records it (solbench.machine.numerics).
    On CUDA the count only sizes the CPU-side work (the GPU's kernels do not depend on it).
    """

    threads: int = 1


# Settings added after runs existed, with the value that reproduces what runs did before them: a run
# whose value is that one hashes as it did before the setting existed, so its results stay valid (the
# committed tiny_paper report among them). Any other value is part of the run id as usual. Spec
# expansion writes the real models' defaults out (solbench.models.reference_defaults), so their runs,
# whose behaviour the defaults changed, get new ids. The method_config rows are part of the run-id rule, not
# of a method's rules: a run id is computed from a stored spec.json before any method is loaded (a launched
# run names its folder first), so they stay here; tests/test_trainer_conformance.py checks each is a field of
# its method's Config with that default.
HASHED_ONLY_WHEN_SET: dict[tuple[str, str], Any] = {
    ("model", "text_max_length"): None,
    ("model", "prompt_instruction"): None,
    ("model", "checkpoint"): None,
    ("model", "compile"): "auto",
    ("model", "rollout_copy"): "auto",
    ("quant", "fast_accum"): False,
    ("finetune", "ema_every"): 1,
    ("finetune", "lora_init"): None,
    ("method_config", "time_type"): "discrete_wo_init",  # AWM
    ("method_config", "weighting"): "uniform",  # AWM
    ("method_config", "ghuber_power"): 0.25,  # AWM
    ("method_config", "detach_uncond"): True,  # FlowGRPO
    ("eval", "guidance"): None,
    ("eval", "resolution"): None,
    ("eval", "shift"): None,
    ("eval", "sampler"): "euler",
    ("eval", "explore_gap_every"): 0,
}


@dataclass
class RunConfig:
    experiment: str = "default"
    method: str = "sol_rl"
    # the method's Config fields by name: after expansion a solbench.method.MethodSettings (the typed Config
    # built once from the spec, as a frozen mapping of its canonical values); read back from spec.json, the mapping
    method_config: dict[str, Any] = field(default_factory=dict)
    model: ModelConfig = field(default_factory=ModelConfig)
    rewards: dict[str, float] = field(default_factory=lambda: {"shapes_geneval": 1.0})  # training reward weights
    train_prompts: str = "shapes/train"
    prompts_per_iter: int = 4  # prompt groups per iteration (global, across ranks)
    iterations: int = 20
    seed: int = 0
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    micro_batch: MicroBatchConfig = field(default_factory=MicroBatchConfig)
    checkpoint_every: int = 1  # iterations between checkpoints (resume granularity)
    device: str = "auto"  # auto | cpu | cuda
    world_size: int = 1  # ranks per run (torch.distributed); part of the result, so hashed
    numerics: NumericsConfig = field(default_factory=NumericsConfig)  # thread count (hashed: it changes the numbers)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["method_config"] = dict(data["method_config"])  # the canonical values of a typed MethodSettings
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunConfig":
        """Inverse of to_dict for stored spec.json files (trusted input: specs are validated earlier)."""
        kwargs = dict(data)
        for name, sub in (("model", ModelConfig), ("finetune", FinetuneConfig), ("quant", QuantConfig),
                          ("sampling", SamplingConfig), ("eval", EvalConfig), ("micro_batch", MicroBatchConfig),
                          ("numerics", NumericsConfig)):
            if name in kwargs and isinstance(kwargs[name], dict):
                sub_kwargs = dict(kwargs[name])
                if name == "finetune" and "adam_betas" in sub_kwargs:
                    sub_kwargs["adam_betas"] = tuple(sub_kwargs["adam_betas"])
                kwargs[name] = sub(**sub_kwargs)
        return cls(**kwargs)

    def canonical_json(self) -> str:
        data = self.to_dict()
        quant = data.get("quant") or {}
        if quant.get("allow_emulated_fallback", False) is None:  # unset: hashed as the value it takes
            quant["allow_emulated_fallback"] = emulated_fallback(quant.get("backend"), None)
        for (section, name), unset in HASHED_ONLY_WHEN_SET.items():
            if section in data and name in data[section] and data[section][name] == unset:
                del data[section][name]
        return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)

    @property
    def run_id(self) -> str:
        """Short hash of the canonical resolved config: the run's identity and results folder."""
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:12]
