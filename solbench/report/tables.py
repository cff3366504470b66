"""The collected results of one experiment, as report plugins see them.

``Tables.load(results_dir)`` reads only what ``solbench collect`` wrote under
``results/<experiment>/``: runs.parquet, metrics.parquet, timings.parquet, candidates.parquet and,
when a sweep ran, ``sweep/trials.parquet`` (or the Optuna storage in ``sweep/``). Evaluation image
grids are the one input read from run folders (``<run_id>/samples/``), and only by the sample-grid
plugin.

It also derives what every plugin needs the same way:
- ``arms``: runs grouped into comparable arms, one per (model, method, method settings); seeds are
  the replicates of an arm. Settings that differ between runs of the same model and method (say
  ``n`` in an ablation) become part of the arm label, e.g. ``Sol-RL (n=48)``.
- method display names and the paper's ordering (solbench/report/method_names.py, re-exported here), from what
  each run recorded (``fact_method_display``);
- the rollout phases, as the runs recorded their methods' (``fact_rollout_phases``), with the same fallback.
- the eval rewards of the spec, the data hash and the git SHAs of the runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from solbench.errors import ConfigError, SolbenchError
from solbench.report.method_names import (  # re-exported: the report's plugins import them from here
    METHOD_DISPLAY_FACT,
    ROLLOUT_PHASES_FACT,
    _remember_display_names,
    method_display,
    method_rank,
    normalise_method,
    same_method,
)

TABLE_FILES = ("runs", "metrics", "timings", "candidates")
REQUIRED_COLUMNS = {
    "runs": ("run_id", "method", "model", "status", "seed"),
    "metrics": ("run_id", "step", "split", "metric", "value", "images_seen", "wall_s"),
    "timings": ("run_id", "step", "phase", "precision", "seconds", "n_images", "flops"),
    "candidates": ("run_id", "step", "prompt_id", "cand_idx", "noise_seed", "precision", "reward", "selected"),
}

#: Phases whose seconds make up "rollout seconds per iteration" (the paper's Table 5 rollout column), for results
#: collected before runs recorded their methods' (fact_rollout_phases, Tables.rollout_phases): a fallback.
ROLLOUT_PHASES = ("explore", "select", "regenerate", "rollout", "reward")
#: Canonical phase order for breakdowns; unknown phases follow in name order.
PHASE_ORDER = ("explore", "select", "regenerate", "rollout", "reward", "train", "sync")
EVAL_PHASES = ("eval",)

# p_* columns never used to tell arms apart (identity and bookkeeping, not settings), and what a fidelity run
# measured when it built its explore copy (solbench.fidelity.experiment.record_mac_share: it follows from the recipe)
_NOT_SETTINGS = {"p_seed", "p_experiment", "p_method", "p_model.name", "p_checkpoint_every", "p_quant.mac_share",
                 "p_quant.quantized_linears", "p_quant.linears"}
_NOT_SETTING_PREFIXES = ("p_model_identity.",)
#: The run's horizon: arms that differ in it are separate arms (never pooled), compared at equal iterations.
HORIZON = "p_iterations"
# short names of settings in arm labels (what a legend has room for)
_SHORT = {"quant.recipe": "recipe", "quant.backend": "backend"}


@dataclass
class ReportOptions:
    """Choices a report makes; each field can be set from the CLI or a spec's ``report:`` mapping."""

    reference_method: str = "diffusion_nft"  # convergence speedup is measured against this method
    baseline_method: str = "naive_bf16"  # timing baseline: naive BF16 scaling (Table 5)
    target_method: str = "sol_rl"  # the method whose speedup Table 5 reports
    warmup: int = 1  # training iterations dropped per run before taking timing medians
    ci_level: float = 0.95
    top_k: tuple[int, ...] = (4, 8, 12)  # ranking fidelity hit rates
    # Findings (docs/reports.md): decision thresholds of the claims that are not "better than"
    noninferiority_margin: float = 0.02  # Sol-RL vs naive BF16: claim holds if the gap is above -2 % of naive's score
    # Table 8, non-inferiority to the paper's figure: FP4 ranks seeds "almost as BF16" when the mean Spearman
    # rho's interval lies above fidelity_reference - fidelity_margin (docs/reports.md, "Findings")
    fidelity_reference: float = 0.927  # the paper's Table 8 Spearman rho
    fidelity_margin: float = 0.05  # the paper's own spread between rewards (tau 0.798 overall, 0.752 CLIPScore)
    # a Table 8 interval wider than this that decides nothing says it is too small to judge (issue 42: the main
    # job's 8 x 8 gave 0.837 [0.680, 0.993])
    fidelity_max_width: float = 0.15
    n_boot: int = 2000  # bootstrap resamples for ratio CIs
    boot_seed: int = 0
    hardware: str = "B200"  # cost projection profile (B200 | H100)
    mfu: float = 0.4  # cost projection: assumed fraction of dense peak reached by every GEMM
    kinds: tuple[str, ...] | None = None  # report kinds to run; None = all
    # Declared before the data (issue 54, solbench.report.readout): the iteration the primary claims are read at
    # (None: each claim's last common evaluation), how it was chosen (required with it), and the fall of a held-out
    # reward from its peak (a fraction of the peak) past which a reading is flagged as reward-hacked
    readout_iteration: int | None = None
    readout_note: str = ""
    hacking_drop: float = 0.10

    def __post_init__(self) -> None:
        """A read-out iteration needs its note (how it was chosen, solbench.report.readout); a horizon or a drop out of
        range is refused (ConfigError)."""
        it, note, drop = self.readout_iteration, self.readout_note, self.hacking_drop
        if it is not None:
            if isinstance(it, bool) or not isinstance(it, int) or it < 1:
                raise ConfigError(f"report.readout_iteration: must be a positive iteration, got {it!r}")
            if not str(note or "").strip():
                raise ConfigError(f"report.readout_iteration: {it} needs report.readout_note beside it: how the iteration "
                                  "was chosen before these data (a pilot on other seeds, a previous report), in words")
        elif str(note or "").strip():
            raise ConfigError("report.readout_note: given without report.readout_iteration (the iteration it explains)")
        if isinstance(drop, bool) or not isinstance(drop, (int, float)) or not 0 < float(drop) < 1:
            raise ConfigError(f"report.hacking_drop: a fraction of the peak between 0 and 1 (0.10: 10 %), got {drop!r}")

    @classmethod
    def from_mapping(cls, data: dict[str, Any] | None, where: str = "report") -> "ReportOptions":
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            import difflib

            hints = [f"{u} (did you mean {m[0]}?)" if (m := difflib.get_close_matches(u, known, 1)) else u
                     for u in unknown]
            raise ConfigError(f"{where}: unknown report option(s) {', '.join(hints)}; known: {', '.join(sorted(known))}")
        for key in ("top_k", "kinds"):
            if data.get(key) is not None:
                data[key] = tuple(data[key])
        return cls(**data)


def _hashable(value: Any) -> Any:
    if isinstance(value, (list, tuple, np.ndarray)):
        return json.dumps([_hashable(v) for v in value], default=str)
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is pd.NA or value is None:
        return None
    return value


def _short_setting(column: str) -> str:
    name = column[2:] if column.startswith("p_") else column
    return name.split(".")[-1] if name.startswith("method_config.") else _SHORT.get(name, name)


def _label_rank(column: str) -> tuple:
    """Order of the settings in an arm label: the checkpoint, the explore recipe, method settings, the rest."""
    return (not column.startswith("p_checkpoint."), column != "p_quant.recipe", not column.startswith("p_method_config."),
            column)


def is_setting(column: str) -> bool:
    """Whether a runs-table column is a setting that tells arms apart (p_*, not identity or a measurement)."""
    return column.startswith("p_") and column not in _NOT_SETTINGS and not column.startswith(_NOT_SETTING_PREFIXES)


def _sort_key(value: Any) -> tuple:
    """Numbers before strings, numbers by value (so n=8 sorts before n=16)."""
    if isinstance(value, bool) or value is None:
        return (2, str(value))
    try:
        return (0, float(value))
    except (TypeError, ValueError):
        return (1, str(value))


def _fmt_setting(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_parquet_table(path: Path, name: str) -> pd.DataFrame:
    """One collected table; a missing file is an empty table with the documented columns."""
    if not path.exists():
        return pd.DataFrame(columns=list(REQUIRED_COLUMNS[name]))
    try:
        frame = pd.read_parquet(path)
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for damaged files
        raise SolbenchError(f"{path}: cannot read the collected {name} table ({err}); run `solbench collect` again") from err
    missing = [c for c in REQUIRED_COLUMNS[name] if c not in frame.columns]
    if missing and not frame.empty:
        raise SolbenchError(f"{path}: {name} table lacks columns {missing}; was it written by `solbench collect`?")
    for column in missing:
        frame[column] = pd.Series(dtype=object)
    return frame


@dataclass
class Tables:
    """An experiment's collected tables plus the derived run grouping (see the module docstring)."""

    experiment: str
    results_dir: Path
    runs: pd.DataFrame
    metrics: pd.DataFrame
    timings: pd.DataFrame
    candidates: pd.DataFrame
    trials: pd.DataFrame | None = None
    trials_direction: str = "maximize"
    options: ReportOptions = field(default_factory=ReportOptions)
    data_hash: str = ""

    # -- loading ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, results_dir: str | Path, options: ReportOptions | None = None) -> "Tables":
        results_dir = Path(results_dir)
        runs_path = results_dir / "runs.parquet"
        if not runs_path.exists():
            raise SolbenchError(f"{results_dir}: no runs.parquet; run `solbench collect` (or `solbench run`) first")
        frames = {name: read_parquet_table(results_dir / f"{name}.parquet", name) for name in TABLE_FILES}
        from solbench.report.sweep_io import load_trials

        trials, direction = load_trials(results_dir / "sweep")
        tables = cls(
            experiment=str(frames["runs"]["experiment"].dropna().iloc[0])
            if "experiment" in frames["runs"] and frames["runs"]["experiment"].notna().any() else results_dir.name,
            results_dir=results_dir,
            runs=frames["runs"],
            metrics=frames["metrics"],
            timings=frames["timings"],
            candidates=frames["candidates"],
            trials=trials,
            trials_direction=direction,
            options=options or ReportOptions(),
            data_hash=data_hash(results_dir),
        )
        tables._prepare()
        return tables

    def _prepare(self) -> None:
        runs = self.runs.copy()
        runs["run_id"] = runs["run_id"].astype(str)
        runs["status"] = runs["status"].fillna("unknown").astype(str)
        for name in ("metrics", "timings", "candidates"):
            frame = getattr(self, name).copy()
            frame["run_id"] = frame["run_id"].astype(str)
            frame["step"] = pd.to_numeric(frame["step"], errors="coerce")
            setattr(self, name, frame)
        for column in ("value", "wall_s", "images_seen"):
            self.metrics[column] = pd.to_numeric(self.metrics[column], errors="coerce")
        self.timings["seconds"] = pd.to_numeric(self.timings["seconds"], errors="coerce")
        self.candidates["reward"] = pd.to_numeric(self.candidates["reward"], errors="coerce")
        _remember_display_names(runs)
        self.runs = _label_arms(runs)

    def rollout_phases(self) -> tuple[str, ...]:
        """The phases whose seconds make up a rollout: those the runs recorded for their methods
        (fact_rollout_phases), else (results collected before they did) ROLLOUT_PHASES."""
        from solbench.report.stored import run_fact

        recorded = run_fact(self.runs, ROLLOUT_PHASES_FACT).dropna() if ROLLOUT_PHASES_FACT in self.runs else []
        phases: set[str] = set()
        for value in recorded:
            try:
                phases.update(str(p) for p in json.loads(value))
            except (TypeError, ValueError):
                return ROLLOUT_PHASES
        if not phases:
            return ROLLOUT_PHASES
        return tuple(sorted(phases, key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else len(PHASE_ORDER), p)))

    # -- runs ------------------------------------------------------------------------------------

    def _is_fidelity(self) -> pd.Series:
        kind = self.runs["p_kind"].astype(str) if "p_kind" in self.runs else pd.Series("", index=self.runs.index)
        return (kind == "fidelity") | (self.runs["method"].astype(str) == "fidelity")

    @property
    def done_runs(self) -> pd.DataFrame:
        """Done training runs (fidelity measurements, which train nothing, are in ``fidelity_runs``)."""
        return self.runs[(self.runs["status"] == "done") & ~self._is_fidelity()]

    @property
    def fidelity_runs(self) -> pd.DataFrame:
        """Done runs of the standalone fidelity experiment (`solbench fidelity`, a spec's ``fidelity:`` block)."""
        return self.runs[(self.runs["status"] == "done") & self._is_fidelity()]

    @property
    def incomplete_runs(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] != "done"]

    def models(self) -> list[str]:
        return sorted(self.runs["model"].dropna().astype(str).unique())

    def arm_order(self, runs: pd.DataFrame | None = None) -> list[str]:
        """Arm labels in the paper's method order, then by label."""
        runs = self.runs if runs is None else runs
        arms = runs.drop_duplicates("arm")
        keys = {arm: (method_rank(method), str(method), tuple(key))
                for arm, method, key in zip(arms["arm"], arms["method"], arms["arm_key"])}
        return sorted(keys, key=lambda a: keys[a])

    def setting_columns(self) -> list[str]:
        """The p_* columns that tell arms of the same model and method apart."""
        return list(self.runs.attrs.get("setting_columns", []))

    def eval_rewards(self) -> list[str]:
        """Eval rewards of the spec (p_eval.rewards, in spec order), restricted to what was measured."""
        measured = self.metrics.loc[(self.metrics["split"] == "eval") & ~self.metrics["metric"].astype(str).str.contains("/"),
                                    "metric"].astype(str).unique().tolist()
        ordered: list[str] = []
        if "p_eval.rewards" in self.runs:
            for raw in self.runs["p_eval.rewards"].dropna():
                names = json.loads(raw) if isinstance(raw, str) else list(raw)
                ordered.extend(n for n in names if n not in ordered)
        ordered = [n for n in ordered if n in measured]
        ordered += sorted(n for n in measured if n not in ordered)
        return ordered

    def headline_metric(self) -> str | None:
        rewards = self.eval_rewards()
        return rewards[0] if rewards else None

    def run_metrics(self, split: str, metric: str, *, done_only: bool = True) -> pd.DataFrame:
        """Rows of one metric joined with run info (model, method, arm, seed)."""
        runs = self.done_runs if done_only else self.runs
        rows = self.metrics[(self.metrics["split"] == split) & (self.metrics["metric"] == metric)]
        return rows.merge(runs[["run_id", "model", "method", "arm", "seed"]], on="run_id", how="inner")

    # -- provenance ------------------------------------------------------------------------------

    def git_shas(self) -> list[str]:
        if "git_sha" not in self.runs:
            return []
        return sorted(self.runs["git_sha"].dropna().astype(str).unique())

    def device_kinds(self) -> set[str]:
        """Devices the runs ran on ('cpu', 'cuda', ...), from the env columns; empty when unknown."""
        kinds: set[str] = set()
        for column in ("device", "env_device", "p_device"):
            if column in self.runs:
                kinds |= {str(v).lower() for v in self.runs[column].dropna() if str(v).lower() not in ("auto", "")}
                if kinds:
                    break
        return kinds

    def provenance_warnings(self) -> list[str]:
        """Warnings for the report header: mixed code versions, uncommitted code, incomplete runs."""
        warnings = []
        shas = self.git_shas()
        if len(shas) > 1:
            counts = self.runs["git_sha"].astype(str).value_counts()
            listing = ", ".join(f"{sha[:10]} ({counts[sha]} runs)" for sha in shas)
            warnings.append(f"These results mix {len(shas)} code versions: {listing}. "
                            "Differences between arms may come from the code, not the method.")
        if "dirty" in self.runs and self.runs["dirty"].fillna(False).astype(bool).any():
            n = int(self.runs["dirty"].fillna(False).astype(bool).sum())
            warnings.append(f"{n} run(s) ran from a working tree with uncommitted changes (git SHA + dirty): "
                            "their exact code cannot be recovered from the SHA.")
        if "git_sha" in self.runs and self.runs["git_sha"].isna().any():
            warnings.append(f"{int(self.runs['git_sha'].isna().sum())} run(s) have no recorded git SHA.")
        bad = self.incomplete_runs
        if len(bad):
            from solbench.report.inert import neutral  # a run's error text is not the report's: quoted inert

            lines = []
            for _, run in bad.iterrows():
                err = str(run.get("error") or "").strip()
                last = err.splitlines()[-1].strip().rstrip(".") if err else ""
                detail = f": {neutral(last, 300)}" if last else ""
                lines.append(f"- `{run['run_id']}` ({run['arm']}, seed {run['seed']}) is **{run['status']}**{detail}")
            warnings.append(f"{len(bad)} of {len(self.runs)} runs are not done and are left out of every "
                            "aggregate below:\n" + "\n".join(lines))
        return warnings


def _label_arms(runs: pd.DataFrame) -> pd.DataFrame:
    """Add ``arm`` (display label) and ``method_display`` columns; record the setting columns."""
    runs = runs.copy()
    runs["method_display"] = runs["method"].map(method_display)
    runs["model"] = runs["model"].astype(str)
    settings: list[str] = []
    labels = pd.Series(runs["method_display"].astype(str).values, index=runs.index)
    sort_keys = pd.Series([()] * len(runs), index=runs.index, dtype=object)
    p_columns = [c for c in runs.columns if is_setting(c)]
    for (_model, _method), group in runs.groupby(["model", "method"], sort=False):
        varying = [c for c in p_columns if group[c].map(_hashable).nunique(dropna=False) > 1]
        # the checkpoint and the recipe first (a fidelity arm is named by them), method settings (n, k, explore
        # steps), then everything else
        varying.sort(key=_label_rank)
        for column in varying:
            if column not in settings:
                settings.append(column)
        for index, run in group.iterrows():
            if varying:
                sort_keys[index] = tuple(_sort_key(_hashable(run[c])) for c in varying)
                parts = [f"{_short_setting(c)}={_fmt_setting(_hashable(run[c]))}" for c in varying
                         if not c.startswith("p_checkpoint.")]
                if any(c.startswith("p_checkpoint.") for c in varying):  # one part, not a path and run id
                    parts.insert(0, f"checkpoint={_checkpoint_label(run, runs)}")
                labels[index] = f"{run['method_display']} ({', '.join(parts)})"
    runs["arm"] = labels
    runs["arm_key"] = sort_keys
    runs.attrs["setting_columns"] = settings
    return runs


def _checkpoint_label(run, runs: pd.DataFrame | None = None) -> str:
    """A fidelity run's checkpoint in a few characters: the method and step it came from and, when the run it
    came from is in these results, that run's seed ("sol_rl@32 seed 1"); or 'base'."""
    method, step = _hashable(run.get("p_checkpoint.method")), _hashable(run.get("p_checkpoint.step"))
    if method is None and _hashable(run.get("p_checkpoint.path")) is None:
        return "base"
    label = f"{method or 'run'}" + (f"@{_fmt_setting(step)}" if step is not None else "")
    source = _hashable(run.get("p_checkpoint.run_id"))
    if runs is not None and source is not None:
        seeds = runs.loc[runs["run_id"].astype(str) == str(source), "seed"]
        if len(seeds) and _hashable(seeds.iloc[0]) is not None:
            label += f" seed {_fmt_setting(_hashable(seeds.iloc[0]))}"
    return label


def data_hash(results_dir: Path) -> str:
    """sha256 over the collected parquet files (name and bytes, in name order), plus sweep trials."""
    digest = hashlib.sha256()
    paths = sorted(results_dir.glob("*.parquet"))
    sweep = results_dir / "sweep"
    if sweep.is_dir():
        paths += sorted(p for p in sweep.iterdir() if p.is_file())
    for path in paths:
        digest.update(str(path.relative_to(results_dir)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
