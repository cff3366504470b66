"""The facts a report needs from code, as data recorded with the results (their names, meaning and schema).

A report reads stored results alone: what it once computed from code at report time (the share of a forward
an explore recipe quantizes, a recipe's format, a model's default explore recipe, the eval grid's prompts, the
paper models' FLOPs per phase and precision, text tokens and trained timesteps) is written once, by the run
(``facts.json``, solbench.train.facts) or by ``solbench collect`` (solbench.collect.facts), into the collected
tables:

- ``RUN_FACTS``: columns of runs.parquet, one value per run, with ``facts_schema``;
- ``PAPER_MODEL_FACTS``: ``paper_model_facts.parquet``, one row per model of the paper's Table 5 (the cost
  projection's inputs, solbench.measure.paper_models), with ``facts_schema``, copied from the committed asset
  ``PAPER_MODEL_ASSET``;
- ``PROVENANCE_TABLE``: ``provenance.parquet``, the deviations of the experiment's provenance table, and its
  summary in collect_report.json (``provenance``).

Results collected before a fact was recorded (no ``facts_schema`` or an older one) are brought up to date by
collecting them again. A leaf module: it imports nothing of solbench, so collect and the report share it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

#: Bumped whenever a fact is added or its meaning changes; results with an older one are collected again.
FACTS_SCHEMA = 1
SCHEMA_COLUMN = "facts_schema"

#: runs.parquet columns holding each run's facts, and what each means.
RUN_FACTS = {
    "fact_quantized_share": "share of one explore forward's FLOPs the run's recipe quantizes on TransformerEngine's "
                            "backend (the hardware a projection prices), at the run's model, resolution and text "
                            "length (solbench.models.shares); empty for runs that explore nothing",
    "fact_explore_format": "the explore recipe's number format (nvfp4, mxfp4, fp8, fp8_e5m2; none: full precision)",
    "fact_default_explore_recipe": "the model's default explore recipe (its card's, solbench.models.DEFAULT_EXPLORE_RECIPES)",
    "fact_eval_grid_prompts": "JSON list: the prompts of the eval grid's rows, in order",
    "fact_eval_grid_columns": "eval seeds per prompt: the eval grid's columns",
    "fact_quant_backends": "JSON object: every quantization backend registered where the facts were recorded (at the "
                           "run's start, or by collect for a run that predates this fact), name -> {label: the "
                           "report's words for it, low_precision: whether its copy computes on low-precision units} "
                           "(solbench.quant.registry), and auto's words",
    "fact_method_display": "the run's method as reports name it (its Method.display_name, solbench.method)",
    "fact_rollout_phases": "JSON list: the timed phases that make up the run's rollout (its method's timed phases but "
                           "sync, Method.rollout_phases)",
    "fact_notes": "what could not be recorded, and why ('' when nothing)",
}
#: The run facts a method declares (results collected before them lack the columns: the report falls back to its
#: own table of the built-in methods, solbench.report.tables).
METHOD_FACTS = ("fact_method_display", "fact_rollout_phases")
#: The run fact naming the quantization backends (results collected before it lack the column: the report says so).
BACKENDS_FACT = "fact_quant_backends"

#: The collected table of the paper models' facts: results/<experiment>/<PAPER_MODEL_FACTS>.parquet.
PAPER_MODEL_FACTS = "paper_model_facts"
#: The committed facts of the paper models (solbench.measure.paper_models writes it), which collect copies into
#: results: here, below both, so that collect reads it without importing the measuring code.
PAPER_MODEL_ASSET = Path(__file__).resolve().parents[1] / "assets" / "paper_model_facts.json"
#: The deviations of the experiment's provenance table (experiments/provenance/<name>.yaml), one row each, beside
#: its summary (file, rows, the reasons as bullets) in collect_report.json's "provenance".
PROVENANCE_TABLE = "provenance"


@dataclass(frozen=True)
class ForwardFlops:
    """FLOPs of one transformer forward for one image, split by what an FP4 recipe quantizes.

    ``quantized``: the FLOPs of the nn.Linear layers the model's NVFP4 recipe swaps for TransformerEngine
    linears, counted per layer by ``solbench.models.shares`` with the rule ``quantized_copy`` applies
    (None: not known; then all of ``linear``)."""

    linear: float
    attention: float
    quantized: float | None = None

    @property
    def total(self) -> float:
        return self.linear + self.attention


@dataclass(frozen=True)
class ModelSetting:
    """What one model's Table 5 iteration runs besides the counts shared by all three (the report's PaperSetting).

    Resolution, text length, recipe and trained timesteps come from the model's real spec; every other value is
    sourced in docs/reports.md, "Cost projection" (solbench.measure.paper_models computes them)."""

    resolution: int  # px: the real spec's (and the public config's) resolution
    rollout_passes: int  # transformer forwards per sampling step (2 = classifier-free guidance)
    train_timesteps: int  # trained timesteps per trained sample: trained_timesteps(steps, timestep_fraction)
    text_tflops: float  # text encoders, per prompt (encoded once per prompt and reused by its candidates)
    text_tokens: int  # text tokens the transformer attends to (the real spec's text_max_length; SD3: + 77)
    vae_tflops: float  # VAE decoding of one image at ``resolution`` (solbench.models.flops.vae_decode_flops)
    reward_tflops: float  # one reward-model call per image
    recipe: str = ""  # the NVFP4 recipe of the explore copy ("": the real spec's)
    flops: ForwardFlops | None = None  # one forward at ``resolution`` and ``text_tokens``, split by precision


def paper_model_row(model: str, setting: ModelSetting, **extra) -> dict:
    """One row of the paper-model facts table: ``model``, the setting's fields, its forward's FLOPs."""
    row = {"model": model, **{k: v for k, v in asdict(setting).items() if k != "flops"}}
    f = setting.flops
    row.update({"linear_flops": f.linear if f else None, "attention_flops": f.attention if f else None,
                "quantized_flops": f.quantized if f else None, **extra, SCHEMA_COLUMN: FACTS_SCHEMA})
    return row


def model_setting(row) -> ModelSetting:
    """The ModelSetting of one row of the paper-model facts table (``paper_model_row``'s inverse)."""
    names = {f.name for f in fields(ModelSetting)} - {"flops"}
    values = {name: _plain(row[name]) for name in names if name in row}
    quantized = _plain(row.get("quantized_flops"))
    flops = ForwardFlops(float(row["linear_flops"]), float(row["attention_flops"]),
                         None if quantized is None else float(quantized))
    return ModelSetting(**values, flops=flops)


def _plain(value):
    """A parquet cell as a Python scalar (numpy int64 -> int, NaN -> None)."""
    if value is None:
        return None
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def grid_prompts(value) -> list[str] | None:
    """The ``fact_eval_grid_prompts`` cell as a list of prompt texts (None: not recorded)."""
    value = _plain(value)
    if not isinstance(value, str) or not value:
        return None
    try:
        texts = json.loads(value)
    except ValueError:
        return None
    return [str(t) for t in texts] if isinstance(texts, list) else None
