"""Provenance tables: where every setting of a real spec comes from, checked against the expanded spec.

A real spec (experiments/flux_main.yaml, ...) has a table beside it, experiments/provenance/<spec
name>.yaml, with one row per setting a reference fixes::

    references:                     # short name -> repository and the commit read
      sana: {repo: NVlabs/Sana, commit: 6926be6..., read: "meefs/Sana (a mirror) at that commit"}
    rows:
      - setting: finetune.grad_clip  # a resolved setting (see SETTINGS and the dotted RunConfig paths)
        methods: [sol_rl, naive_scaling, naive_fp4, diffusion_nft]   # or "all"
        value: 0.002                 # the reference's value
        ref: sana                    # a key of references
        file: configs/sol_rl/base.py
        at: "get_config: train.max_grad_norm = 0.002"   # the line, or the config key
      - setting: finetune.lora_rank
        methods: [flow_grpo]
        value: 64
        ref: flow_grpo
        file: scripts/train_flux.py
        at: "LoraConfig(r=64, lora_alpha=128)"
        solbench: 32                  # what the spec resolves to instead ...
        deviation: the paper's shared setting, every method at LoRA r=32 alpha=64   # ... and why

``check(spec_path)`` expands the spec and compares, for every run, every row of its method: the
resolved value equals the row's ``value``, or, for a deviation, its ``solbench`` value (which must
differ from ``value``, and carry a one-line reason). Every run's method must have a row for every
setting in REQUIRED, so a setting cannot drop out of the table unnoticed. The spec's header comment
lists every deviation (``header_block`` writes that list) and the report shows them
(solbench.report.provenance).

``python -m solbench.provenance check SPEC`` prints the problems; ``... header SPEC`` the header block.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solbench.config import RunConfig
from solbench.errors import ConfigError

TABLE_FOLDER = "provenance"  # experiments/provenance/<spec name>.yaml

# Every method of a real spec has a row for each of these (a row may say "no such setting": value null).
REQUIRED = (
    "model.name", "model.path", "model.resolution", "derived.text_max_length", "prompts_per_iter",
    "derived.group_size", "derived.candidates_per_prompt", "world_size", "sampling.steps",
    "derived.rollout_sampler", "derived.rollout_shift", "derived.rollout_guidance", "finetune.mode", "finetune.lr",
    "finetune.adam_betas", "finetune.weight_decay", "finetune.grad_clip", "finetune.lora_rank",
    "finetune.lora_alpha", "finetune.lora_targets", "derived.lora_init", "eval.use_ema", "derived.old_policy_decay",
    "derived.kl_beta", "derived.clip_range",
    "method_config.adv_clip", "method_config.timestep_fraction", "derived.trained_timesteps",
    "derived.optimizer_steps_per_rollout", "derived.reward_weights", "eval.prompts", "eval.n_prompts",
    "sampling.eval_steps", "derived.eval_sampler", "eval.rewards",
)
# ... methods whose evaluation samples the EMA these (without it they are unused).
REQUIRED_EMA = ("finetune.ema_decay", "finetune.ema_every")
# ... and methods with an explore copy these.
REQUIRED_EXPLORE = ("quant.recipe", "recipe.format", "recipe.activations", "recipe.skip", "recipe.min_dim")
ROW_KEYS = {"setting", "methods", "value", "ref", "file", "at", "solbench", "deviation", "note"}


def _method(cfg: RunConfig):
    from solbench.method import RunInfo, get_method, validate_method_config

    cls = get_method(cfg.method)
    return cls(validate_method_config(cfg.method, cfg.method_config),
               RunInfo(prompts_per_iter=cfg.prompts_per_iter, steps=cfg.sampling.steps, shift=cfg.sampling.shift,
                       guidance=cfg.sampling.guidance, finetune_mode=cfg.finetune.mode, world_size=cfg.world_size))


def optimizer_steps_per_iteration(cfg: RunConfig) -> int:
    """Optimizer steps one iteration takes, as solbench.trainer.Trainer.optimize counts them."""
    mc = cfg.method_config
    trained = cfg.prompts_per_iter * mc.get("k", mc.get("group_size"))
    n_micro = -(-trained // mc["micro_batch_size"]) if mc.get("micro_batch_size") else 1
    if cfg.finetune.optimizer_steps is not None:
        return min(cfg.finetune.optimizer_steps, n_micro)
    return -(-n_micro // (cfg.finetune.grad_accum * cfg.world_size))


def _trained_timesteps(cfg: RunConfig) -> int:
    """Schedule points each trained sample is trained at per iteration (each method's chunks())."""
    mc, steps = cfg.method_config, cfg.sampling.steps
    if cfg.method == "dance_grpo":
        return max(1, int((steps - 1) * mc["timestep_fraction"]))
    if cfg.method == "awm":
        return mc["train_timesteps"]
    return max(1, int(steps * mc["timestep_fraction"]))


def _rollout_spec(cfg: RunConfig):
    method = _method(cfg)
    return method.sampler_spec() if hasattr(method, "sampler_spec") else method.rollout_spec()


def _text_max_length(cfg: RunConfig) -> int | None:
    if cfg.model.text_max_length is not None:
        return cfg.model.text_max_length
    from solbench.models.flux import FluxAdapter
    from solbench.models.sana import SanaAdapter
    from solbench.models.sd3 import SD3Adapter

    adapter = {"flux": FluxAdapter, "sd3": SD3Adapter, "sana": SanaAdapter}.get(cfg.model.name)
    return None if adapter is None else adapter.max_sequence_length


def _recipe(cfg: RunConfig):
    from solbench.quant import get_recipe

    return get_recipe(cfg.quant.recipe)


def _lora_init(cfg: RunConfig) -> str:
    from solbench.models import default_lora_init

    return cfg.finetune.lora_init or default_lora_init(cfg.model.name)


def _old_policy_decay(cfg: RunConfig) -> list[float] | None:
    mc = cfg.method_config
    for rate, cap in (("old_decay_rate", "old_decay_max"), ("slow_decay_rate", "slow_decay_max")):
        if rate in mc:
            return [mc[rate], mc[cap]]
    return None


# Settings that are not a dotted RunConfig path: name -> resolver of one run's value.
SETTINGS: dict[str, Callable[[RunConfig], Any]] = {
    "derived.text_max_length": _text_max_length,
    "derived.group_size": lambda c: c.method_config.get("k", c.method_config.get("group_size")),
    "derived.candidates_per_prompt": lambda c: c.method_config.get("n", c.method_config.get("group_size")),
    "derived.rollout_sampler": lambda c: _rollout_spec(c).kind,
    "derived.rollout_guidance": lambda c: _rollout_spec(c).guidance,
    "derived.rollout_shift": lambda c: _rollout_spec(c).shift,  # None: the model scheduler's own
    "derived.lora_init": _lora_init,
    "derived.old_policy_decay": _old_policy_decay,
    "derived.kl_beta": lambda c: c.method_config.get("kl_beta", 0.0),
    "derived.clip_range": lambda c: c.method_config.get("clip_range"),
    "derived.trained_timesteps": _trained_timesteps,
    "derived.optimizer_steps_per_rollout": optimizer_steps_per_iteration,
    "derived.reward_weights": lambda c: sorted(c.rewards.values()),
    "derived.eval_sampler": lambda c: "euler",  # solbench.trainer.Trainer.evaluate, every method
    "recipe.format": lambda c: _recipe(c).format,
    "recipe.activations": lambda c: _recipe(c).activations,
    "recipe.skip": lambda c: list(_recipe(c).skip),
    "recipe.min_dim": lambda c: _recipe(c).min_dim,
    "recipe.min_dim_exempt": lambda c: list(_recipe(c).min_dim_exempt),
}


def resolve(cfg: RunConfig, setting: str) -> Any:
    """The value of ``setting`` in one resolved run (a SETTINGS name or a dotted RunConfig path such as
    ``finetune.lr`` or ``method_config.kl_beta``); KeyError for a path the run does not have."""
    if setting in SETTINGS:
        return SETTINGS[setting](cfg)
    node: Any = cfg
    for part in setting.split("."):
        if isinstance(node, Mapping):
            node = node[part]
        elif hasattr(node, part):
            node = getattr(node, part)
        else:
            raise KeyError(setting)
    return list(node) if isinstance(node, tuple) else node


# Settings compared after a normalisation of both sides. LoRA targets are a set of PEFT name suffixes; the
# references write FLUX's and SD3's attention projections as attn.<name> (flow_grpo, AWM) or <name> (Sol-RL),
# which select the same layers there (every attention projection of both models sits in a module named attn).
# Skip names: the reference keeps a layer when a name is a substring of its qualified name; solbench's
# recipes write the same names as globs (*name* for a substring; FLUX's names as bare module names, which
# select the same layers there), so both sides are compared without their '*'.
NORMALISE: dict[str, Callable[[Any], Any]] = {
    "finetune.lora_targets": lambda targets: targets if targets is None else sorted(
        str(t).removeprefix("attn.") for t in targets),
    "recipe.skip": lambda names: names if names is None else [str(n).strip("*") for n in names],
}


def same(a: Any, b: Any) -> bool:
    """Equality of YAML values and resolved settings: numbers by value (1 == 1.0, relative 1e-12), lists
    and tuples alike, dicts key by key."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or (isinstance(a, bool) and isinstance(b, bool) and a == b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(same(a[k], b[k]) for k in a)
    return a == b


@dataclass
class Row:
    setting: str
    methods: list[str]
    value: Any
    ref: str
    file: str
    at: str
    line: int  # in the table file
    deviation: str | None = None
    solbench: Any = None
    note: str = ""

    @property
    def expected(self) -> Any:
        """What the spec must resolve to: the reference's value, or solbench's for a deviation."""
        return self.solbench if self.deviation else self.value


@dataclass
class Table:
    path: Path
    spec: str
    references: dict[str, dict[str, str]]
    rows: list[Row] = field(default_factory=list)

    def deviations(self) -> list[Row]:
        return [r for r in self.rows if r.deviation]

    def deviation_bullets(self) -> list[str]:
        """One line per distinct reason: "- <reason>: <setting> [<methods>], ..." (header and report)."""
        groups: dict[str, dict[str, list[str]]] = {}
        for row in self.deviations():
            settings = groups.setdefault(row.deviation.strip(), {})
            settings.setdefault(row.setting, [])
            settings[row.setting] += [m for m in row.methods if m not in settings[row.setting]]
        return [f"- {reason}: " + ", ".join(f"{setting} [{', '.join(methods)}]" for setting, methods in settings.items())
                for reason, settings in groups.items()]


def table_path(spec_path: str | Path, spec_name: str) -> Path:
    return Path(spec_path).parent / TABLE_FOLDER / f"{spec_name}.yaml"


def _is_run_path(setting: str) -> bool:
    from solbench.spec import _is_run_path as is_run_path

    return is_run_path(setting)


def find_table(experiment: str) -> Path | None:
    """The provenance table of an experiment by name (experiments/provenance/<name>.yaml under the working
    directory or the solbench checkout), or None: the reports' way to find it without the spec."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[1]):
        path = root / "experiments" / TABLE_FOLDER / f"{experiment}.yaml"
        if path.is_file():
            return path
    return None


def load_table(path: str | Path, methods: list[str] | None) -> Table:
    """Read and validate a provenance table; ConfigError naming the file, line and key of a bad row.

    ``methods``: the spec's methods ("all" expands to them, others are errors); None keeps "all" as is
    and checks no method names (a report without its spec)."""
    from solbench.spec import load_yaml

    path = Path(path)
    data, lines = load_yaml(path)

    def fail(loc: tuple, message: str) -> ConfigError:
        return ConfigError(f"{path}:{lines.get(loc, lines.get(loc[:2], '?'))}: {message}")

    unknown = set(data) - {"spec", "references", "rows"}
    if unknown or not isinstance(data.get("rows"), list) or not isinstance(data.get("references"), dict):
        raise fail((), f"a provenance table has spec, references and rows (got {sorted(data)})")
    references = data["references"]
    table = Table(path=path, spec=str(data.get("spec")), references=references)
    seen: dict[tuple[str, str], int] = {}
    for index, raw in enumerate(data["rows"]):
        loc = ("rows", index)
        line = lines.get(loc, 0)
        if not isinstance(raw, dict) or set(raw) - ROW_KEYS or not {"setting", "value", "ref", "file", "at"} <= set(raw):
            raise fail(loc, f"rows[{index}]: a row has setting, value, ref, file, at (+ methods, solbench and "
                            f"deviation, note); got {sorted(raw) if isinstance(raw, dict) else raw!r}")
        setting = raw["setting"]
        if setting not in SETTINGS and not setting.startswith("method_config.") and not _is_run_path(setting):
            raise fail(loc, f"rows[{index}]: unknown setting {setting!r} (a dotted RunConfig path or one of "
                            f"{', '.join(sorted(SETTINGS))})")
        every = raw.get("methods", "all") == "all"
        row_methods = (["all"] if methods is None else methods) if every else list(raw["methods"])
        stray = [m for m in row_methods if methods is not None and m not in methods]
        if stray:
            raise fail(loc, f"rows[{index}] ({setting}): methods {stray} are not in the spec ({', '.join(methods)})")
        if raw["ref"] not in references:
            raise fail(loc, f"rows[{index}] ({setting}): ref {raw['ref']!r} is not one of references "
                            f"({', '.join(references)})")
        if ("deviation" in raw) != ("solbench" in raw):
            raise fail(loc, f"rows[{index}] ({setting}): a deviation needs both solbench (the spec's value) and "
                            "deviation (its one-line reason)")
        if "deviation" in raw:
            reason = raw["deviation"]
            if not isinstance(reason, str) or not reason.strip() or "\n" in reason.strip():
                raise fail(loc, f"rows[{index}] ({setting}): deviation must be a one-line reason")
            norm = NORMALISE.get(setting, lambda v: v)
            if same(norm(raw["solbench"]), norm(raw["value"])):
                raise fail(loc, f"rows[{index}] ({setting}): solbench equals the reference's value: not a deviation")
        for method in row_methods:
            if (setting, method) in seen:
                raise fail(loc, f"rows[{index}]: {setting} of {method} already has a row (line {seen[setting, method]})")
            seen[setting, method] = line
        table.rows.append(Row(setting=setting, methods=row_methods, value=raw["value"], ref=raw["ref"],
                              file=str(raw["file"]), at=str(raw["at"]), line=line, deviation=raw.get("deviation"),
                              solbench=raw.get("solbench"), note=str(raw.get("note", ""))))
    return table


def _header_text(spec_path: Path) -> str:
    """The spec's leading comment block, without the '#' marks, whitespace-normalised."""
    text = []
    for line in Path(spec_path).read_text().splitlines():
        if not line.startswith("#"):
            break
        text.append(line[1:].strip())
    return " ".join(" ".join(text).split())


def check(spec_path: str | Path) -> list[str]:
    """Every problem of a real spec against its provenance table (empty: the two agree)."""
    from solbench.spec import load_spec

    spec = load_spec(spec_path)
    methods = list(dict.fromkeys(run.method for run in spec.runs))
    path = table_path(spec_path, spec.name)
    if not path.is_file():
        return [f"{spec_path}: no provenance table at {path}"]
    table = load_table(path, methods)
    problems = []
    by_method: dict[str, dict[str, Row]] = {m: {} for m in methods}
    for row in table.rows:
        for method in row.methods:
            by_method[method][row.setting] = row
    for method in methods:
        runs = [r.config for r in spec.runs if r.method == method]
        explore = any("explore" in _method(cfg).nets for cfg in runs)
        wanted = (REQUIRED + (REQUIRED_EXPLORE if explore else ())
                  + (REQUIRED_EMA if any(cfg.eval.use_ema for cfg in runs) else ()))
        missing = [s for s in wanted if s not in by_method[method]]
        if missing:
            problems.append(f"{path}: {method} has no row for {', '.join(missing)}")
    for run in spec.runs:
        cfg = run.config
        for setting, row in by_method[cfg.method].items():
            try:
                actual = resolve(cfg, setting)
            except (KeyError, AttributeError):
                problems.append(f"{path}:{row.line}: {setting} does not exist in {cfg.method}'s runs")
                continue
            norm = NORMALISE.get(setting, lambda v: v)
            if not same(norm(actual), norm(row.expected)):
                kind = f"the deviation's solbench value {row.solbench!r}" if row.deviation else \
                    f"the reference's {row.value!r} ({row.ref} {row.file}: {row.at})"
                problems.append(f"{path}:{row.line}: {setting} of {cfg.method} (run {cfg.run_id}) resolves to "
                                f"{actual!r}, not {kind}")
    header = _header_text(spec_path)
    for bullet in table.deviation_bullets():
        if " ".join(bullet.split()) not in header:
            problems.append(f"{spec_path}: its header does not list the deviation {bullet!r} of {path} "
                            f"(python -m solbench.provenance header {spec_path} prints the block)")
    return list(dict.fromkeys(problems))


def header_block(spec_path: str | Path) -> str:
    """The spec-header comment lines listing every deviation of its provenance table."""
    from solbench.spec import load_spec

    spec = load_spec(spec_path)
    path = table_path(spec_path, spec.name)
    table = load_table(path, list(dict.fromkeys(run.method for run in spec.runs)))
    lines = [f"# Deviations from the references ({path.as_posix()}, checked by tests/test_provenance.py):"]
    for bullet in table.deviation_bullets():
        words, line = bullet.split(), "#"
        for word in words:
            if len(line) + 1 + len(word) > 110 and line != "#":
                lines.append(line)
                line = "#  "
            line += " " + word
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("check", "header"):
        print("usage: python -m solbench.provenance check|header SPEC", file=sys.stderr)
        return 2
    if argv[0] == "header":
        print(header_block(argv[1]))
        return 0
    problems = check(argv[1])
    print("\n".join(problems) if problems else f"{argv[1]}: every setting matches its provenance row")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
