"""The resolver: expands a validated spec into its runs, each a fully resolved and checked RunConfig.

``_Resolver.expand`` checks the matrix, include and exclude keys (method names first: every later check
depends on them), forms the combinations, and resolves each (``_Resolver.resolve``): RunConfig defaults <
``base`` < ``methods.<method>`` < the combination's values, then the method's Config, the model's
micro-batch and reference defaults, and the checks of a whole run (registries, counts, batch arithmetic).
Sweeps resolve their sampled combinations through the same code (``ExperimentSpec.resolve``).

One class, about 520 lines: every step above reads the same state (the spec's merged sections, its line table for
``file:line`` errors, the registries), so they are methods of ``_Resolver``, the matrix bound counted before any
combination is formed (``_check_size``) and the prompt files read once per expansion (``_prompt_file_problem``)
among them; the typed models it validates against
are solbench.spec.models, the fidelity block's checks solbench.spec.fidelity_block, a backend resolved on this CPU
solbench.quant.backends.resolve_on_cpu. ``_check_run`` (the longest method) is a flat list of independent checks
of one run, each naming its key and line.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import time
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from solbench.config import RunConfig
from solbench.errors import ConfigError
from solbench.spec.fidelity_block import check_fidelity_block
from solbench.spec.models import _RESERVED_FIELDS, COUNT_LIMIT, SpecModel, _format_validation_error, _FullRun
from solbench.spec.plan import ExperimentSpec, PlannedRun
from solbench.spec.registries import GRAMMAR_REWARDS, Registries, fetch_hint, is_prompt_path
from solbench.spec.yaml_lines import _dotted, _nearest_line

#: Combinations a spec's matrix and include entries may form (before exclude): resolving one takes about a
#: millisecond and a run table row, so this many take seconds; `--max-runs N` on expand, run and status lifts it.
MAX_RUNS = 10_000
#: Seconds an expansion runs before it reports its progress (and between two reports).
PROGRESS_EVERY_S = 3.0

# Run sections that merge key by key; every other field (e.g. the rewards dict) is replaced whole.
_SECTIONS = tuple(name for name, hint in typing.get_type_hints(RunConfig).items() if dataclasses.is_dataclass(hint))


def _deep_merge(target: dict, overrides: Mapping) -> dict:
    """Merge ``overrides`` into ``target``: sections and method_config merge per key, other values replace."""
    for key, value in overrides.items():
        if key in (*_SECTIONS, "method_config") and isinstance(value, Mapping) and isinstance(target.get(key), dict):
            target[key] = {**target[key], **value}
        else:
            target[key] = value
    return target


class _Resolver:
    """Turns matrix combinations into validated RunConfigs for one spec."""

    def __init__(self, model: SpecModel, source: str, lines: dict[tuple, int], registries: Registries, *,
                 max_runs: int = MAX_RUNS, progress: Callable[[int, int, float], None] | None = None):
        from solbench.method import get_method, method_names

        self.max_runs = max_runs
        self.progress = progress
        self.model = model
        self.source = source
        self.lines = lines
        self.registries = registries
        self.get_method = get_method
        self.method_names = method_names()
        self.notes: list[str] = []
        self.missing_files: list[str] = []  # prompt files of the runs that are not on this machine
        self._prompt_files: dict[Any, tuple] = {}  # name (or (name, "grammar")) -> (records, problem or None)
        # Overrides as validated (so 1 and 1.0 hash alike); only the keys the user wrote.
        self.base = model.base.model_dump(exclude_unset=True)
        self.per_method = {name: ov.model_dump(exclude_unset=True) for name, ov in model.methods.items()}
        for name in self.per_method:
            self._check_method_name(name, ("methods", name))
        self.method_axes = {name: tuple(get_method(name).axes) for name in self.method_names}

    # -- helpers -------------------------------------------------------------------------------

    def _where(self, loc: tuple) -> str:
        line = _nearest_line(self.lines, loc)
        return f"{self.source}:{line}" if line else self.source

    def _error(self, loc: tuple, message: str) -> ConfigError:
        return ConfigError(f"{self._where(loc)}: {_dotted(loc)}: {message}")

    def _key_where(self, key: str, method: str, loc: tuple) -> str:
        """file:line where a run's value of ``key`` (dotted) is set: the combination's own entry (an include
        entry), the matrix, the method's overrides or base, the most specific first; else the combination's
        own line. A method axis (``method_config.k``) is also found by its matrix name (``k``)."""
        parts = tuple(key.split("."))
        names = (key, parts[-1]) if parts[0] == "method_config" else (key,)
        for candidate in (*((*loc, name) for name in names), *(("matrix", name) for name in names),
                          ("methods", method, *parts), ("base", *parts)):
            if candidate in self.lines:
                return self._where(candidate)
        return self._where(loc)

    def _check_method_name(self, name: Any, loc: tuple) -> None:
        if name not in self.method_names:
            close = difflib.get_close_matches(str(name), self.method_names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise self._error(loc, f"unknown method {name!r}{hint}; methods: {', '.join(self.method_names)}")

    def _key_kind(self, key: str, loc: tuple) -> str:
        """'method' | 'path' (a RunConfig field) | 'axis' (a method axis); errors otherwise."""
        if key == "method":
            return "method"
        if key in _RESERVED_FIELDS:
            raise self._error(loc, f"{key!r} is set by the spec's name, not the matrix")
        if key == "model" or _is_run_path(key):
            return "path"
        all_axes = sorted({a for axes in self.method_axes.values() for a in axes})
        if key in all_axes:
            return "axis"
        fields = sorted(f.name for f in dataclasses.fields(RunConfig) if f.name not in _RESERVED_FIELDS)
        close = difflib.get_close_matches(key, all_axes + fields, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        config_owners = [m for m in self.method_names
                         if key in {f.name for f in dataclasses.fields(self.get_method(m).Config)}]
        extra = (f"; {key!r} is a Config field of {', '.join(config_owners)} but not a declared axis: set it under "
                 f"methods.<name>.method_config") if config_owners else ""
        raise self._error(loc, f"unknown matrix key {key!r}{hint}{extra}. Allowed: method, model, a RunConfig field "
                               f"or dotted path ({', '.join(fields)}), or a method axis ({', '.join(all_axes)})")

    # -- expansion ------------------------------------------------------------------------------

    def expand(self, path: Path) -> ExperimentSpec:
        model = self.model
        matrix = {key: (values if isinstance(values, list) else [values]) for key, values in model.matrix.items()}
        for key in matrix:
            self._key_kind(key, ("matrix", key))
        for index, entry in enumerate(model.include):
            for key in entry:
                self._key_kind(key, ("include", index, key))
        for index, entry in enumerate(model.exclude):
            for key in entry:
                if key not in matrix:
                    raise self._error(("exclude", index, key),
                                      f"exclude key {key!r} is not a matrix key ({', '.join(matrix)})")
        if "method" not in matrix and not model.include:
            raise self._error(("matrix",), "no runs: give matrix.method (a list of methods) or include entries")
        # the method names first: every later check depends on the list of methods
        for index, method in enumerate(matrix.get("method", [])):
            self._check_method_name(method, ("matrix", "method", index))
        for index, entry in enumerate(model.include):
            methods = entry.get("method", [])
            for method in (methods if isinstance(methods, list) else [methods]):
                self._check_method_name(method, ("include", index, "method"))
        self._check_axes_used(matrix)
        self._check_size(matrix)

        combos: list[tuple[dict, tuple]] = []
        if "method" in matrix:
            keys = list(matrix)
            for values in itertools.product(*(matrix[k] for k in keys)):
                combo = dict(zip(keys, values))
                if not any(_matches(combo, entry) for entry in model.exclude):
                    combos.append((combo, ("matrix",)))
        for index, entry in enumerate(model.include):
            # keys the entry does not give range over the matrix's values
            free = [k for k in matrix if k not in entry]
            listed = {k: (v if isinstance(v, list) else [v]) for k, v in entry.items()}
            if "method" not in listed and "method" not in free:
                raise self._error(("include", index), "include entry needs a method (no matrix.method to range over)")
            keys = list(listed) + free
            pools = [listed[k] for k in listed] + [matrix[k] for k in free]
            for values in itertools.product(*pools):
                combos.append((dict(zip(keys, values)), ("include", index)))

        runs: dict[str, PlannedRun] = {}
        duplicates = 0
        started = said = time.monotonic()
        for done, (combo, loc) in enumerate(combos):
            if self.progress is not None and time.monotonic() - said >= PROGRESS_EVERY_S:
                said = time.monotonic()
                self.progress(done, len(combos), said - started)
            run = self.resolve(combo, loc)
            if run.run_id in runs:
                duplicates += 1
                continue
            runs[run.run_id] = run
        if duplicates:
            self.notes.append(f"{duplicates} combination(s) collapsed into identical runs (axes a method does not use "
                              "are dropped)")
        if not runs:
            raise self._error(("matrix",), "the spec expands to no runs (everything excluded?)")
        check_fidelity_block(model.fidelity, list(runs.values()), self.source, self.lines, self.registries)
        from solbench.spec.speed_block import check_speed_block

        check_speed_block(model.speed, list(runs.values()), self.source, self.lines)
        axis_keys = list(matrix) + [k for entry in model.include for k in entry if k not in matrix]
        return ExperimentSpec(name=model.name, path=path, description=model.description, launch=model.launch,
                              runs=list(runs.values()), sweep=model.sweep, axis_keys=list(dict.fromkeys(axis_keys)),
                              notes=self.notes, _resolver=self, fidelity=model.fidelity, speed=model.speed,
                              missing_files=self.missing_files)

    def _check_size(self, matrix: dict[str, list]) -> None:
        """The combinations the matrix and include entries form, counted before any is formed: past
        ``max_runs`` one line naming the bound, the line and each axis's number of values."""
        parts = []
        if "method" in matrix:
            parts.append((("matrix",), math.prod(len(v) for v in matrix.values()),
                          " x ".join(f"{key} {len(values):,}" for key, values in matrix.items())))
        for index, entry in enumerate(self.model.include):
            pools = {k: (v if isinstance(v, list) else [v]) for k, v in entry.items()}
            pools.update({k: v for k, v in matrix.items() if k not in entry})
            parts.append((("include", index), math.prod(len(v) for v in pools.values()),
                          " x ".join(f"{key} {len(values):,}" for key, values in pools.items())))
        total = sum(count for _, count, _ in parts)
        if total <= self.max_runs:
            return
        loc, count, sizes = max(parts, key=lambda part: part[1])
        rest = "" if count == total else f", {total:,} with the rest of the spec"
        raise self._error(loc, f"forms {count:,} combinations ({sizes} values){rest}, past the bound of "
                               f"{self.max_runs:,} runs a spec expands to (before exclude); `--max-runs {total}` on "
                               "expand, run and status lifts it")

    def _check_axes_used(self, matrix: dict[str, list]) -> None:
        """A method axis is dropped for methods that lack it; one that no listed method has would be
        dropped everywhere, silently: an error (a typo'd method list, or the wrong axis)."""
        def methods_of(values: Any) -> list:
            return [m for m in (values if isinstance(values, list) else [values]) if m in self.method_axes]

        listed = methods_of(matrix.get("method", []))
        for entry in self.model.include:
            listed += methods_of(entry.get("method", []))
        entries = [(("matrix", key), key, listed) for key in matrix]
        in_matrix = methods_of(matrix.get("method", []))  # what an include entry without a method ranges over
        entries += [(("include", i, key), key, methods_of(entry["method"]) if "method" in entry else in_matrix)
                    for i, entry in enumerate(self.model.include) for key in entry]
        for loc, key, methods in entries:
            if self._key_kind(key, loc) != "axis" or any(key in self.method_axes[m] for m in methods):
                continue
            owners = sorted(m for m, axes in self.method_axes.items() if key in axes)
            raise self._error(loc, f"no listed method ({', '.join(dict.fromkeys(methods))}) has the axis {key!r}, "
                                   f"so it would vary nothing; methods with it: {', '.join(owners)}")

    def resolve(self, combo: dict[str, Any], loc: tuple) -> PlannedRun:
        method = combo.get("method")
        self._check_method_name(method, loc + ("method",))
        label = ", ".join(f"{k}={v}" for k, v in combo.items())
        cfg = RunConfig().to_dict()
        cfg["experiment"] = self.model.name
        cfg["method"] = method
        cfg["method_config"] = {}
        _deep_merge(cfg, self.base)
        _deep_merge(cfg, self.per_method.get(method, {}))
        used: dict[str, Any] = {"method": method}
        method_axes = self.method_axes[method]
        for key, value in combo.items():
            if key == "method":
                continue
            kind = self._key_kind(key, loc + (key,))
            if kind == "axis":
                if key in method_axes:
                    cfg["method_config"][key] = value
                    used[key] = value
                continue
            if key in _SECTIONS and isinstance(value, Mapping):  # {eval: {every: 4}}: merged as in base and methods
                _deep_merge(cfg, {key: value})
            else:
                _set_path(cfg, "model.name" if key == "model" else key, value)
            used[key] = value

        # Types of the merged run (matrix values included), then the method's own Config.
        try:
            checked = _FullRun.model_validate_json(json.dumps(cfg), strict=True).model_dump()
        except ValidationError as err:
            # the line where the first wrong value is set (the matrix entry of finetune.lr, say)
            first = ".".join(str(part) for part in err.errors()[0]["loc"] if not isinstance(part, int))
            raise ConfigError(f"{self._key_where(first, method, loc)}: run ({label}): "
                              + str(_format_validation_error(err, "", {}, _FullRun)).lstrip(": ")) from None
        # the method's Config, built once (strictly: a key it lacks is named with the line that sets it); it
        # travels typed, as a frozen MethodSettings, to the method
        from solbench.method import build_method_settings

        checked["method_config"] = build_method_settings(
            method, checked["method_config"], where=f"run ({label}): method_config",
            locate=lambda key: self._key_where(f"method_config.{key}", method, loc) if key else self._where(loc))
        self._resolve_micro_batches(checked, loc, label)
        self._resolve_model_defaults(checked)
        self._resolve_explore_backend(checked, method)
        config = RunConfig.from_dict(checked)
        self._check_run(config, loc, label)
        return PlannedRun(config=config, axes=used)

    def _resolve_micro_batches(self, checked: dict, loc: tuple, label: str) -> None:
        """micro_batch.{rollout,reward,train}: the model's defaults where unset (solbench.models), and
        ``train`` written into the method's micro_batch_size (the same setting) when it has one."""
        try:
            from solbench.models import resolve_micro_batches
        except ImportError:  # the models part is absent: nothing to resolve against
            return
        mc = checked["method_config"]
        try:
            checked["micro_batch"] = resolve_micro_batches(checked["model"]["name"], checked.get("micro_batch") or {},
                                                           mc.get("micro_batch_size"))
        except ConfigError as err:
            raise ConfigError(f"{self._where(loc)}: run ({label}): {err}") from None
        if "micro_batch_size" in mc:
            checked["method_config"] = mc.replace(micro_batch_size=checked["micro_batch"]["train"])

    @staticmethod
    def _resolve_explore_backend(checked: dict, method: str) -> None:
        """``quant.backend: auto`` on a run that computes on this CPU, written out as the backend it takes here
        (solbench.quant.backends.resolve_on_cpu): for a method with an explore copy cpu_bf16 on a CPU with bf16
        units, emulated elsewhere; a method without one computes nothing in low precision, so its quant section
        is written as emulation's whatever the CPU: the run id changes only where the numbers do."""
        from solbench.method import get_method
        from solbench.quant.backends import resolve_on_cpu

        resolve_on_cpu(checked["quant"], checked["device"], checked["model"]["name"],
                       explores="explore" in get_method(method).nets)

    def _resolve_model_defaults(self, checked: dict) -> None:
        """A real model's unset text length, prompt instruction and LoRA init written out as its reference
        defaults (solbench.models.reference_defaults), so the run id says what the run does."""
        try:
            from solbench.models import reference_defaults
        except ImportError:  # the models part is absent
            return
        for section, values in reference_defaults(checked["model"]["name"]).items():
            for key, value in values.items():
                if checked[section].get(key) is None:
                    checked[section][key] = value

    def _check_run(self, cfg: RunConfig, loc: tuple, label: str) -> None:
        """Names against registries, positive counts and batch arithmetic."""
        where = f"{self._where(loc)}: run ({label})"
        reg = self.registries

        def fail(key: str, message: str) -> None:
            raise ConfigError(f"{self._key_where(key, cfg.method, loc)}: run ({label}): {key}: {message}")

        def check_name(key: str, value: str, known: list[str] | None, what: str) -> None:
            if known is not None and value not in known:
                close = difflib.get_close_matches(value, known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                fail(key, f"unknown {what} {value!r}{hint}; allowed: {', '.join(known)}")

        check_name("model.name", cfg.model.name, reg.models, "model")
        if not cfg.rewards:
            fail("rewards", "at least one training reward is needed")
        for reward in cfg.rewards:
            check_name(f"rewards.{reward}", reward, reg.rewards, "reward")
        for index, reward in enumerate(cfg.eval.rewards):
            check_name(f"eval.rewards[{index}]", reward, reg.rewards, "reward")
        check_name("quant.recipe", cfg.quant.recipe, reg.recipes, "quantization recipe")
        for key, name in (("train_prompts", cfg.train_prompts), ("eval.prompts", cfg.eval.prompts)):
            if is_prompt_path(name) and reg.prompt_set_size is not None and not Path(name).expanduser().exists():
                # named by `solbench expand`, refused by `solbench run` (ExperimentSpec.missing_files); the library
                # expands the spec all the same (the real specs' data/pickscore files are downloaded apart)
                missing = (f"{self._key_where(key, cfg.method, loc)}: {key}: prompt file {name!r} not found (a path "
                           f"relative to the working directory, {Path.cwd()}); {fetch_hint(name)}")
                if missing not in self.missing_files:
                    self.missing_files.append(missing)
            if is_prompt_path(name):
                # a file: decoded now where it is on this machine (so that no run fails on it in its
                # worker), and parsed where a shapes reward scores it; one that is not here is looked for at
                # launch (launch.preflight)
                if reg.prompt_set_size is not None and Path(name).expanduser().is_file():
                    scored = cfg.rewards if key == "train_prompts" else cfg.eval.rewards
                    problem = self._prompt_file_problem(name, [r for r in scored if r in GRAMMAR_REWARDS])
                    if problem:
                        fail(key, problem)
                continue
            if reg.prompt_set_exists is not None and not reg.prompt_set_exists(name):
                fail(key, f"unknown prompt set {name!r} (embedded sets are named shapes/<split>; files end in "
                          ".txt or .jsonl)")
        # Counts against the sets (a prompt file that is not on this machine is checked at launch).
        size = reg.prompt_set_size or (lambda name: None)
        for key, wanted, name in (("prompts_per_iter", cfg.prompts_per_iter, cfg.train_prompts),
                                  ("eval.n_prompts", cfg.eval.n_prompts, cfg.eval.prompts)):
            available = size(name)
            if wanted is not None and available is not None and wanted > available:
                raise ConfigError(f"{self._key_where(key, cfg.method, loc)}: run ({label}): {key}: {wanted} exceeds "
                                  f"the {available} prompts of {name!r}")
        # The tiny model's weights: the shipped ones, a random init or a folder of pretrained weights
        # (solbench.models._build_tiny).
        if cfg.model.name == "tiny" and cfg.model.path not in (None, "pretrained", "random"):
            from solbench.models.tiny import tiny_weights_folder_problem

            problem = tiny_weights_folder_problem(cfg.model.path)
            if problem:
                raise ConfigError(f"{self._key_where('model.path', cfg.method, loc)}: run ({label}): model.path: "
                                  f"{cfg.model.path!r} is no tiny model ({problem}); use pretrained (the shipped "
                                  "weights, the default), random (an untrained init) or a folder written by "
                                  "scripts/pretrain_tiny.py --out")
        for key in ("iterations", "prompts_per_iter", "world_size", "checkpoint_every", "eval.every",
                    "eval.seeds_per_prompt", "sampling.steps", "sampling.eval_steps", "finetune.grad_accum",
                    "finetune.lora_rank", "numerics.threads"):
            if _get_path(cfg, key) < 1:
                fail(key, f"must be >= 1, got {_get_path(cfg, key)}")
        if cfg.eval.resolution is not None and (cfg.eval.resolution < 1 or cfg.model.name == "tiny"):
            fail("eval.resolution", f"got {cfg.eval.resolution}: a positive number of pixels, or null (the training "
                                    "resolution; the tiny model samples only at its own)")
        steps = cfg.finetune.optimizer_steps
        if steps is not None:
            if steps < 1:
                fail("finetune.optimizer_steps", f"must be >= 1 or null, got {steps}")
            if cfg.finetune.grad_accum != 1:
                fail("finetune.optimizer_steps", f"set either optimizer_steps or grad_accum (got grad_accum="
                                                 f"{cfg.finetune.grad_accum}): optimizer_steps fixes the steps per iteration")
            if steps > 1 and not cfg.method_config.get("micro_batch_size"):
                fail("finetune.optimizer_steps", f"{steps} steps per iteration need method_config.micro_batch_size "
                                                 "(the batch is one micro-batch without it)")
        if cfg.eval.n_prompts is not None and cfg.eval.n_prompts < 1:
            fail("eval.n_prompts", f"must be >= 1 or null (all), got {cfg.eval.n_prompts}")
        if cfg.finetune.mode not in ("lora", "full"):
            fail("finetune.mode", f"must be lora or full, got {cfg.finetune.mode!r}")
        if cfg.finetune.lora_init not in (None, "gaussian", "kaiming"):
            fail("finetune.lora_init", f"must be gaussian, kaiming or null (the model's default), got "
                                       f"{cfg.finetune.lora_init!r}")
        if cfg.finetune.ema_every < 1:
            fail("finetune.ema_every", f"must be >= 1, got {cfg.finetune.ema_every}")
        if reg.models is not None:
            from solbench.models import check_model_settings

            try:
                check_model_settings(cfg.model)
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from None
        if cfg.device not in ("auto", "cpu", "cuda"):
            fail("device", f"must be auto, cpu or cuda, got {cfg.device!r}")
        from solbench.quant.registry import check_name as backend_name_problem  # the registered backends, or auto

        if backend_name_problem(cfg.quant.backend) is not None:
            fail("quant.backend", backend_name_problem(cfg.quant.backend))
        if cfg.prompts_per_iter % cfg.world_size:
            fail("prompts_per_iter", f"{cfg.prompts_per_iter} prompt groups do not split over world_size="
                                     f"{cfg.world_size} ranks; use a multiple of {cfg.world_size}")
        mc = cfg.method_config
        for key, value in mc.items():  # every integer of a method's Config is a count (n, k, steps, a batch)
            if isinstance(value, int) and not isinstance(value, bool) and value > COUNT_LIMIT:
                fail(f"method_config.{key}", f"should be less than or equal to {COUNT_LIMIT}, got {value} (a count past "
                                             f"{COUNT_LIMIT:,} (2**16): more samples or steps than any machine holds)")
        # the method's own rules between its fields and the run (Method.validate: K <= N, explore steps, ...)
        method_cls = self.get_method(cfg.method)
        for key, message in method_cls.validate(mc.config, cfg):
            fail(key, message)
        trained_per_prompt = method_cls.trained_per_prompt(mc.config)  # K, or the group size (Method.trained_per_prompt)
        micro = mc.get("micro_batch_size")
        if trained_per_prompt is not None and micro:
            per_rank = cfg.prompts_per_iter // cfg.world_size * trained_per_prompt
            if per_rank % micro:
                fail("method_config.micro_batch_size",
                     f"{micro} does not divide the {per_rank} trained samples per rank "
                     f"({cfg.prompts_per_iter // cfg.world_size} prompts x {trained_per_prompt})")
            n_micro = per_rank // micro
            steps = cfg.finetune.optimizer_steps
            if steps is not None and (n_micro * cfg.world_size) % steps:
                fail("finetune.optimizer_steps", f"{steps} does not divide the {n_micro * cfg.world_size} micro-batches "
                                                 f"per iteration ({cfg.world_size} ranks x {per_rank} samples / "
                                                 f"micro_batch_size {micro})")
            if n_micro % cfg.finetune.grad_accum:
                fail("finetune.grad_accum", f"{cfg.finetune.grad_accum} does not divide the {n_micro} micro-batches "
                                            f"per iteration ({per_rank} samples / micro_batch_size {micro})")

    def _prompt_file_problem(self, name: str, grammar_rewards: list[str]) -> str | None:
        """Why prompt file ``name`` cannot serve a run that scores it with ``grammar_rewards`` (None when it
        can): it does not decode, or one of its prompts is outside the shapes grammar those rewards parse.
        Each file is read once however many runs name it."""
        from solbench.world.prompts import load_prompt_set, outside_grammar

        if name not in self._prompt_files:
            try:
                self._prompt_files[name] = (load_prompt_set(name), None)
            except ConfigError as err:
                self._prompt_files[name] = (None, str(err))
        records, problem = self._prompt_files[name]
        if problem or not grammar_rewards:
            return problem
        checked = (name, "grammar")
        if checked not in self._prompt_files:
            self._prompt_files[checked] = (None, outside_grammar(records, name))
        problem = self._prompt_files[checked][1]
        return problem and f"{problem}; the run scores it with {', '.join(grammar_rewards)}, which parse every prompt"


def _is_run_path(key: str) -> bool:
    parts = key.split(".")
    current: Any = RunConfig
    for part in parts:
        if not (isinstance(current, type) and dataclasses.is_dataclass(current)):
            return False
        hints = typing.get_type_hints(current)
        if part not in hints or part in _RESERVED_FIELDS:
            return False
        current = hints[part]
    return True


def _set_path(cfg: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value


def _get_path(cfg: RunConfig, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _matches(combo: Mapping[str, Any], entry: Mapping[str, Any]) -> bool:
    for key, wanted in entry.items():
        options = wanted if isinstance(wanted, list) else [wanted]
        if combo.get(key) not in options:
            return False
    return True
