"""A programmatic GenEval-style judge for shapes-world images: find objects, then check a prompt.

Detection (vectorised over the batch where it matters):
1. Colour: each pixel's HSV hue is compared with the four palette hues (circular distance); a pixel
   belongs to its nearest colour when its chroma (max - min of RGB) is at least CHROMA_MIN and the
   hue is within HUE_MAX_DEG. The background is grey (chroma ~0), so it never matches; blending
   with it keeps the hue, so anti-aliased and blurry edges keep their colour.
2. Objects: 4-connected components of each colour mask (scipy.ndimage.label over the whole
   batch at once, with a structure that does not connect different images); components under
   MIN_AREA pixels are noise and are dropped before any per-component work.
3. Shape: the component's coverage map (chroma relative to its 90th-percentile chroma, over the
   component grown by one pixel) is compared with a circle, a square and an upward triangle drawn
   by the renderer with the same area and centroid (soft IoU, the "fit"). The best fit names the
   shape; the fits also measure, continuously, how well the shape is drawn. Fill ratio alone (the
   feasibility run's cue) confuses ragged squares with circles, and a binary bounding-box
   template calls 9 px circles squares; the soft fit is exact on renders and smooth on blurs.
4. Position: GenEval's rule on box centres, with its 0.1 x (sum of box sizes) slack.

Scoring a prompt (its `Requirements`, from solbench.world.grammar):
- strict (0/1, GenEval's "correct"): every object requirement is met by hard detections (exact
  count for counting prompts, at least the count otherwise; components below MIN_AREA pixels are
  noise) and the relation holds between the largest matching objects.
- graded (continuous in [0, 1], for training): the mean over requirements of soft scores. Each
  component gets a match score for a class = colour score (chroma-weighted hue closeness times
  saturation) x shape score (softmax of the fits times a ramp of the fit itself) x size weight; the
  soft count is their sum; an object requirement scores 1 - |soft count - n| / n (exact) or
  min(soft count, n) / n (at least); a relation scores the best matches' presence times a linear
  ramp of the relation margin. Small improvements in drawing move the score, which ranks samples
  far better than a 2-4-valued score (feasibility run).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch
from scipy import ndimage

from solbench.world.grammar import RELATION_DIRECTION, Requirements, parse_prompt
from solbench.world.scenes import COLOURS, SHAPES, shape_coverage

CHROMA_MIN = 0.2  # hard colour mask: chroma at least this (palette chroma is 0.62-0.78)
HUE_MAX_DEG = 35.0  # hard colour mask: hue within this of the nearest palette hue
HUE_FULL_DEG = 15.0  # soft colour: full hue credit within this distance, none at HUE_MAX_DEG
CHROMA_FULL = 0.5  # soft colour: full saturation credit at this median chroma
MIN_AREA = 10  # pixels: smaller components are noise (the smallest object covers about 28)
SIZE_FULL_AREA = 20  # soft size weight rises linearly from 0 at MIN_AREA to 1 here
SHAPE_TEMPERATURE = 0.05  # softmax temperature over shape fits
FIT_LO, FIT_HI = 0.5, 0.8  # a fit below FIT_LO earns no shape credit, above FIT_HI full credit
POSITION_SLACK = 0.1  # GenEval: offsets shrink by this fraction of the two boxes' sizes
RELATION_LO, RELATION_HI = 0.3, 0.7  # graded relation ramp on the margin; strict threshold is 0.5

COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)


def _hue_deg(rgb: np.ndarray) -> np.ndarray:
    """HSV hue in degrees of an array [..., 3] (0 for grey pixels)."""
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    mx, mn = rgb.max(-1), rgb.min(-1)
    chroma = np.maximum(mx - mn, 1e-8)
    hue = np.where(mx == r, ((g - b) / chroma) % 6, np.where(mx == g, (b - r) / chroma + 2, (r - g) / chroma + 4))
    return hue * 60.0


PALETTE_HUES = _hue_deg(np.asarray(list(COLOURS.values()), dtype=np.float32))


@dataclass
class DetectedObject:
    colour: str
    shape: str  # best fit
    fits: dict[str, float]  # soft IoU with each shape's template (fit_shapes)
    cx: float  # bounding-box centre, pixels
    cy: float
    width: float
    height: float
    area: int  # pixels in the component
    colour_score: float  # in [0, 1]: hue purity x saturation

    def match(self, colour: str, shape: str) -> float:
        """Soft score in [0, 1] that this component is a well drawn object of class (colour, shape)."""
        if colour != self.colour:
            return 0.0
        fits = np.array([self.fits[s] for s in SHAPES])
        probs = np.exp((fits - fits.max()) / SHAPE_TEMPERATURE)
        prob = probs[SHAPES.index(shape)] / probs.sum()
        quality = np.clip((self.fits[shape] - FIT_LO) / (FIT_HI - FIT_LO), 0.0, 1.0)
        size = np.clip((self.area - MIN_AREA) / (SIZE_FULL_AREA - MIN_AREA), 0.0, 1.0)
        return float(prob * quality * size * self.colour_score)

    def is_a(self, colour: str, shape: str) -> bool:
        """Hard decision used by the strict score."""
        return self.colour == colour and self.shape == shape and self.area >= MIN_AREA


SHAPE_FILL = {"circle": np.pi / 4, "square": 1.0, "triangle": 0.5}  # area / bounding-box area
# Centroid minus bounding-box centre, in box sides (a triangle's centroid sits 1/6 below its box centre).
SHAPE_CENTROID_DY = {"circle": 0.0, "square": 0.0, "triangle": 1.0 / 6.0}


def fit_shapes(coverage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Soft template fits of one object's coverage map (a crop with the object and a margin).

    For each shape the template is that shape with the object's area and centroid, drawn with the
    renderer's anti-aliasing; the fit is the soft IoU sum(min) / sum(max) of coverage and template.
    Sub-pixel exact on rendered scenes (a 9 px circle is a rounded blob that a binary
    bounding-box template confuses with a square), smooth on blurry samples.
    Returns (fits [n_shapes], boxes [n_shapes, 3] of (cx, cy, size) in crop pixels).
    """
    h, w = coverage.shape
    x, y = np.meshgrid(np.arange(w, dtype=np.float32) + 0.5, np.arange(h, dtype=np.float32) + 0.5, indexing="xy")
    area = float(coverage.sum())
    mx, my = float((coverage * x).sum()) / area, float((coverage * y).sum()) / area
    fits, boxes = np.empty(len(SHAPES)), np.empty((len(SHAPES), 3))
    for i, shape in enumerate(SHAPES):
        size = float(np.sqrt(area / SHAPE_FILL[shape]))
        cy = my - SHAPE_CENTROID_DY[shape] * size
        template = shape_coverage(shape, x, y, mx, cy, size)
        fits[i] = np.minimum(coverage, template).sum() / np.maximum(coverage, template).sum()
        boxes[i] = (mx, cy, size)
    return fits, boxes


def _as_numpy_hwc(images: torch.Tensor) -> np.ndarray:
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(f"expected images [B, 3, H, W], got shape {tuple(images.shape)}")
    return images.detach().to("cpu", torch.float32).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def colour_maps(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per pixel: nearest palette colour index (-1 = background), chroma and hue closeness in [0, 1]."""
    chroma = rgb.max(-1) - rgb.min(-1)
    hue = _hue_deg(rgb)
    dist = np.abs(hue[..., None] - PALETTE_HUES)
    dist = np.minimum(dist, 360.0 - dist)
    nearest = dist.argmin(-1)
    nearest_dist = np.take_along_axis(dist, nearest[..., None], -1)[..., 0]
    hard = (chroma >= CHROMA_MIN) & (nearest_dist <= HUE_MAX_DEG)
    index = np.where(hard, nearest, -1)
    closeness = np.clip((HUE_MAX_DEG - nearest_dist) / (HUE_MAX_DEG - HUE_FULL_DEG), 0.0, 1.0)
    return index, chroma, closeness


_NO_CROSS_IMAGE = np.zeros((3, 3, 3), dtype=bool)
_NO_CROSS_IMAGE[1] = ndimage.generate_binary_structure(2, 1)  # 4-connected within one image only
_GROW = ndimage.generate_binary_structure(2, 2)  # 8-neighbour dilation
PAD = 2  # crop margin (pixels) around a component for its shape fit


def detect(images: torch.Tensor) -> list[list[DetectedObject]]:
    """Objects found in each image of a batch [B, 3, H, W] in [0, 1] (any device)."""
    rgb = _as_numpy_hwc(images)
    index, chroma, closeness = colour_maps(rgb)
    height, width = rgb.shape[1:3]
    found: list[list[DetectedObject]] = [[] for _ in range(rgb.shape[0])]
    for k, colour in enumerate(COLOUR_NAMES):
        labels, n = ndimage.label(index == k, structure=_NO_CROSS_IMAGE)
        if n == 0:
            continue
        # Drop components under MIN_AREA pixels (noise; their graded size weight is 0) before any
        # per-component work: a noisy sample has hundreds of them. Relabel the rest 1..m.
        areas = np.bincount(labels.ravel(), minlength=n + 1)
        keep = areas >= MIN_AREA
        keep[0] = False
        if not keep.any():
            continue
        relabel = np.where(keep, np.cumsum(keep), 0)
        labels = relabel[labels]
        kept_areas = areas[keep]
        for lab, box in enumerate(ndimage.find_objects(labels), start=1):
            b = box[0].start
            mask = labels[box][0] == lab
            area = int(kept_areas[lab - 1])
            comp_chroma = chroma[box][0][mask]
            purity = float((closeness[box][0][mask] * comp_chroma).sum() / max(comp_chroma.sum(), 1e-8))
            k90 = int(0.9 * (comp_chroma.size - 1))
            peak = float(np.partition(comp_chroma, k90)[k90])  # 90th percentile, robust to a hot pixel
            # Coverage map: chroma relative to the object's peak (blending with the grey background
            # scales chroma by coverage), over the component grown by one pixel to take in the faint
            # anti-aliased rim, in a crop with a margin of PAD pixels.
            y0, x0 = max(box[1].start - PAD, 0), max(box[2].start - PAD, 0)
            y1, x1 = min(box[1].stop + PAD, height), min(box[2].stop + PAD, width)
            own = ndimage.binary_dilation(labels[b, y0:y1, x0:x1] == lab, _GROW)
            coverage = np.clip(chroma[b, y0:y1, x0:x1] / max(peak, 1e-6), 0.0, 1.0) * own
            fits, boxes = fit_shapes(coverage)
            best = int(fits.argmax())
            cx, cy, size = boxes[best]
            found[b].append(DetectedObject(
                colour=colour,
                shape=SHAPES[best],
                fits={s: float(f) for s, f in zip(SHAPES, fits)},
                cx=x0 + float(cx),
                cy=y0 + float(cy),
                width=float(size),
                height=float(size),
                area=area,
                colour_score=purity * min(1.0, float(np.median(comp_chroma)) / CHROMA_FULL),
            ))
    return found


def relation_margin(subject: DetectedObject, reference: DetectedObject, relation: str) -> float:
    """GenEval's relation test as a number in [-1, 1]: the relation holds when it exceeds 0.5.

    The offset between box centres shrinks by POSITION_SLACK x (sum of box sizes) per axis and is
    divided by the unshrunk distance; the margin is its component along the relation's direction.
    """
    offset = np.array([subject.cx - reference.cx, subject.cy - reference.cy])
    norm = float(np.linalg.norm(offset))
    if norm < 1e-6:
        return 0.0
    dims = np.array([subject.width + reference.width, subject.height + reference.height])
    revised = np.maximum(np.abs(offset) - POSITION_SLACK * dims, 0.0) * np.sign(offset)
    return float(revised @ np.asarray(RELATION_DIRECTION[relation]) / norm)


def score_strict(objects: list[DetectedObject], req: Requirements) -> float:
    """1.0 when every requirement is met (GenEval's "correct"), else 0.0."""
    chosen = []
    for o in req.objects:
        matches = [d for d in objects if d.is_a(o.colour, o.shape)]
        if len(matches) < o.count or (o.exact and len(matches) != o.count):
            return 0.0
        chosen.append(max(matches, key=lambda d: d.area))
    rel = req.relation
    if rel is not None and relation_margin(chosen[rel.subject], chosen[rel.reference], rel.relation) <= 0.5:
        return 0.0
    return 1.0


def score_graded(objects: list[DetectedObject], req: Requirements) -> float:
    """Mean over the prompt's requirements of continuous scores in [0, 1] (see module docstring)."""
    parts, best = [], []
    for o in req.objects:
        matches = [d.match(o.colour, o.shape) for d in objects]
        soft_count = float(sum(matches))
        if o.exact:
            parts.append(max(0.0, 1.0 - abs(soft_count - o.count) / o.count))
        else:
            parts.append(min(soft_count, o.count) / o.count)
        best.append(int(np.argmax(matches)) if matches else None)
    rel = req.relation
    if rel is not None:
        i, j = best[rel.subject], best[rel.reference]
        if i is None or j is None or i == j:
            parts.append(0.0)
        else:
            a, b = objects[i], objects[j]
            presence = min(a.match(*_cls(req, rel.subject)), b.match(*_cls(req, rel.reference)))
            ramp = (relation_margin(a, b, rel.relation) - RELATION_LO) / (RELATION_HI - RELATION_LO)
            parts.append(presence * float(np.clip(ramp, 0.0, 1.0)))
    return float(np.mean(parts))


def _cls(req: Requirements, idx: int) -> tuple[str, str]:
    return req.objects[idx].colour, req.objects[idx].shape


@functools.lru_cache(maxsize=65536)
def _parse_cached(prompt: str) -> Requirements:
    return parse_prompt(prompt)


def score_images(images: torch.Tensor, prompts: list[str], *, strict: bool) -> torch.Tensor:
    """Scores [B] float32 on CPU of images [B, 3, H, W] in [0, 1] against shapes-world prompts."""
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    reqs = [_parse_cached(p) for p in prompts]  # parse first: a bad prompt fails before any work
    scorer = score_strict if strict else score_graded
    detections = detect(images)
    return torch.tensor([scorer(d, r) for d, r in zip(detections, reqs)], dtype=torch.float32)


def extra_objects(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Objects detected beyond what each prompt asks for: max(0, hard detections - the prompt's object count),
    [B] float32 on CPU. The graded and strict scores read non-counting prompts as "at least", so extra
    objects never lower them: this count is how the report sees a policy that draws more than it was asked."""
    if len(prompts) != images.shape[0]:
        raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
    reqs = [_parse_cached(p) for p in prompts]
    detections = detect(images)
    return torch.tensor([max(0, len(d) - sum(o.count for o in r.objects)) for d, r in zip(detections, reqs)],
                        dtype=torch.float32)
