"""Sample grids: per method, the eval samples at the first and the last evaluation, side by side.

The trainer saves one image grid per evaluation in ``results/<experiment>/<run_id>/samples/`` (the
fixed eval prompts and eval-stream seeds, so the first and last grids show the same prompts and
noise): one row per prompt, one column per eval seed. File names carry the step as their last number
(``eval_step_000012.png``, ``step_12.png``, ...). For every arm the done run with the lowest seed is
shown, one figure per arm, each grid row labelled with its prompt.

The row prompts come from the JSON the trainer writes beside each grid (``eval_step_<step>.json``:
rows, columns, cell size). Grids without one (older runs) get the prompts ``solbench collect`` recorded
from the run's eval settings (``fact_eval_grid_prompts`` and ``fact_eval_grid_columns`` of runs.parquet,
solbench.results.stored_facts: the first ``eval.grid_prompts`` prompts of the first ``eval.n_prompts`` of the eval
set, ``eval.seeds_per_prompt`` columns); the labels are left off when the image's size does not fit that
layout, or the collected tables lack them (the caption says which). This and the grids are the report
inputs read from outside the collected parquet tables.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from pathlib import Path

import numpy as np

from solbench.report.plotting import new_figure
from solbench.report.registry import Figure, Note, report_kind
from solbench.report.stored import missing
from solbench.report.tables import Tables
from solbench.results.stored_facts import SCHEMA_COLUMN, grid_prompts

_STEP_RE = re.compile(r"(\d+)(?!.*\d)")
_IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def sample_files(run_dir: Path) -> dict[int, Path]:
    """Eval grid images of one run by step (the last number in each file name)."""
    folder = Path(run_dir) / "samples"
    found: dict[int, Path] = {}
    if not folder.is_dir():
        return found
    for path in sorted(folder.iterdir()):
        if path.suffix.lower() in _IMAGE_SUFFIXES:
            match = _STEP_RE.search(path.stem)
            if match:
                found.setdefault(int(match.group(1)), path)
    return found


def _load(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


@report_kind("sample_grids", title="Samples: first vs last evaluation", order=80)
def sample_grids(tables: Tables):
    """Per method, the eval sample grid at the first and last evaluation (same prompts and seeds), rows labelled."""
    outputs = []
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        for arm in tables.arm_order(runs):
            for _, run in runs[runs["arm"] == arm].sort_values("seed").iterrows():
                files = sample_files(tables.results_dir / str(run["run_id"]))
                if files:
                    outputs.append(_arm_figure(model, arm, run, files))
                    break
    if not outputs:
        return Note("Samples", "No run folder holds eval sample grids (results/<experiment>/<run_id>/samples/).")
    return outputs


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", str(text).lower()).strip("_") or "arm"


def _setting(run, column: str, default):
    value = run.get(column) if hasattr(run, "get") else None
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return default
    return value


def grid_layout(run, image_path: Path, shape: tuple[int, int]) -> tuple[list[str], int, int] | None:
    """(row prompt texts, rows, columns) of one eval grid, or None when they cannot be known for sure.

    From the trainer's JSON beside the image, else the grid prompts recorded with the run's facts
    (fact_eval_grid_*), accepted only if the image splits into square cells of that many rows and columns.
    """
    height, width = shape
    meta_path = Path(image_path).with_suffix(".json")
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            texts = [str(r["text"]) for r in meta["rows"]]
            columns = int(meta["columns"])
        except (ValueError, KeyError, TypeError):
            texts, columns = [], 0
        if texts and columns and height % len(texts) == 0 and width % columns == 0:
            return texts, len(texts), columns
    texts = grid_prompts(_setting(run, "fact_eval_grid_prompts", None))
    columns = _setting(run, "fact_eval_grid_columns", None)
    if not texts or not columns:
        return None
    rows, columns = len(texts), int(columns)
    if rows < 1 or columns < 1 or height % rows or width % columns or height // rows != width // columns:
        return None
    return texts, rows, columns


def _arm_figure(model: str, arm: str, run, files: dict[int, Path]) -> Figure:
    first, last = min(files), max(files)
    images = [(_load(files[first]), first), (_load(files[last]), last)]
    h, w = images[0][0].shape[:2]
    layout = grid_layout(run, files[first], (h, w))
    labels = [textwrap.shorten(t, 90, placeholder="...") for t in layout[0]] if layout else []
    label_width = min(5.0, 0.3 + 0.055 * max(map(len, labels))) if labels else 0.3
    panel_width = 2.4
    panel_height = panel_width * h / max(w, 1)
    fig_width = label_width + 2 * panel_width + 0.4
    title = f"{model}, {arm} (seed {run['seed']}): eval samples, first vs last evaluation"
    # wrapped to the figure's width (about 12 characters an inch at 9 pt): a long arm label was clipped at both edges
    title = textwrap.fill(title, width=max(20, int(fig_width * 12)))
    fig = new_figure(fig_width, min(panel_height, 14.0) + 0.8 + 0.16 * title.count("\n"))
    axes = fig.subplots(1, 2, squeeze=False)[0]
    for c, (ax, (im, step)) in enumerate(zip(axes, images)):
        ax.imshow(im, interpolation="nearest")
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"step {step}" + (" (base)" if step == 0 else ""), fontsize=8)
        if layout and im.shape[:2] == (h, w):
            _, rows, columns = layout
            if c == 0:
                ax.set_yticks([(r + 0.5) * h / rows - 0.5 for r in range(rows)], labels, fontsize=7)
            ax.set_xticks([(k + 0.5) * w / columns - 0.5 for k in range(columns)],
                          [f"seed {k}" for k in range(columns)], fontsize=7)  # 7 pt: the smallest legible
            ax.tick_params(length=0)
    fig.suptitle(title, fontsize=9)
    if layout:
        prompts = "Rows are labelled with their eval prompts; columns within a grid are the eval seeds."
    elif _setting(run, SCHEMA_COLUMN, None) is None:
        prompts = "Rows are unlabelled: the grid has no metadata. " + missing("the eval grid's prompts")
    else:
        prompts = ("The grid rows' prompts are unknown here (no grid metadata, and the run's eval settings do not fit "
                   "the image), so rows are unlabelled.")
    return Figure(f"samples_{_slug(model)}_{_slug(arm)}", f"Eval samples, {model}: {arm}", fig, (
        f"{arm} (its lowest-seed done run, `{run['run_id']}`): the eval grid at the first evaluation (step 0: the "
        "base model) and at the last, for the same eval prompts and noise seeds, so any difference is the training. "
        + prompts))
