"""Sample grids: per method, the eval samples at the first and the last evaluation, side by side.

The trainer saves one image grid per evaluation in ``results/<experiment>/<run_id>/samples/`` (the
fixed eval prompts and eval-stream seeds, so the first and last grids show the same prompts and
noise). File names carry the step as their last number (``step_000012.png``, ``eval_12.png``, ...).
For every arm the done run with the lowest seed is shown. This is the one report input read from run
folders rather than the collected parquet tables.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from solbench.report.plotting import new_figure
from solbench.report.registry import Figure, Note, report_kind
from solbench.report.tables import Tables

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
    """Per method, the eval sample grid at the first and last evaluation (same prompts and seeds)."""
    outputs = []
    for model in tables.models():
        runs = tables.done_runs[tables.done_runs["model"] == model]
        shown = []
        for arm in tables.arm_order(runs):
            for _, run in runs[runs["arm"] == arm].sort_values("seed").iterrows():
                files = sample_files(tables.results_dir / str(run["run_id"]))
                if files:
                    first, last = min(files), max(files)
                    shown.append((arm, run, first, files[first], last, files[last]))
                    break
        if not shown:
            continue
        images = [(_load(s[3]), _load(s[5])) for s in shown]
        h, w = images[0][0].shape[:2]
        width = 8.0
        height = len(shown) * (3.6 * h / max(w, 1) + 0.4) + 0.5
        fig = new_figure(width, height)
        axes = fig.subplots(len(shown), 2, squeeze=False)
        for r, ((arm, run, s0, _, s1, _), (im0, im1)) in enumerate(zip(shown, images)):
            for c, (im, step) in enumerate(((im0, s0), (im1, s1))):
                ax = axes[r][c]
                ax.imshow(im, interpolation="nearest")
                ax.set_xticks([])
                ax.set_yticks([])
                if c == 0:
                    ax.set_ylabel(f"{arm}\nseed {run['seed']}", fontsize=8)
                ax.set_title(f"step {step}", fontsize=8)
        fig.suptitle(f"{model}: eval samples, first vs last evaluation", fontsize=10)
        outputs.append(Figure(f"samples_{model}", f"Eval samples, {model}", fig, (
            "Each row: one method (its lowest-seed done run), the eval grid at the first evaluation (step 0: the base "
            "model) and at the last, for the same eval prompts and noise seeds, so any difference is the training.")))
    if not outputs:
        return Note("Samples", "No run folder holds eval sample grids (results/<experiment>/<run_id>/samples/).")
    return outputs
