"""Legibility checks of a drawn matplotlib figure, measured with matplotlib's own text extents.

``chart_defects(fig)`` draws the figure at the dpi the report saves it at (solbench/report/build.py: 110) on an
Agg canvas and returns one line per defect: a text smaller than ``min_pt`` points, a text that runs past the
figure's edge (the saved PNG cuts it), two texts whose boxes overlap, and an axes (or a legend) with more than
``max_series`` labelled series, and an axis that draws tick labels but has no label (its own, a panel's of the same
column or row, or the figure's supxlabel / supylabel; images are exempt). Tick labels count only where their tick is
drawn (inside the view limits).
"""

from __future__ import annotations

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text

SAVED_DPI = 110
MIN_PT = 7.0
MAX_SERIES = 8
#: pixels two boxes must share in both directions to count as overlapping (anti-aliasing and rounding below)
_SLACK = 1.0


def _drawn_texts(fig) -> list[Text]:
    """Every visible, non-empty text the figure draws, tick labels only of the ticks drawn."""
    hidden: set[int] = set()
    for ax in fig.axes:
        if not ax.get_visible():
            hidden.update(id(t) for t in ax.findobj(Text))
            continue
        for axis in ax._axis_map.values():
            drawn = {id(t) for t in axis._update_ticks()}
            for tick in axis.majorTicks + axis.minorTicks:
                if id(tick) not in drawn:
                    hidden.update((id(tick.label1), id(tick.label2)))
    out = []
    for text in fig.findobj(Text):
        if id(text) in hidden or not text.get_visible() or not text.get_text().strip():
            continue
        if text.get_alpha() == 0:
            continue
        out.append(text)
    return out


def _name(text: Text) -> str:
    s = text.get_text().replace("\n", " ")
    return repr(s if len(s) <= 50 else s[:47] + "...")


def chart_defects(fig, *, dpi: float = SAVED_DPI, min_pt: float = MIN_PT, max_series: int = MAX_SERIES) -> list[str]:
    """One line per legibility defect of ``fig`` drawn at ``dpi`` (empty: none)."""
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    width, height = fig.bbox.width, fig.bbox.height
    defects = []
    texts = _drawn_texts(fig)
    boxes = []
    for text in texts:
        size = text.get_fontsize()
        if size < min_pt - 1e-9:
            defects.append(f"text {_name(text)} is {size:.1f} pt (under {min_pt:g} pt)")
        box = text.get_window_extent(renderer)
        if box.x0 < -_SLACK or box.y0 < -_SLACK or box.x1 > width + _SLACK or box.y1 > height + _SLACK:
            defects.append(f"text {_name(text)} is clipped by the figure edge ({box.x0:.0f}..{box.x1:.0f} x "
                           f"{box.y0:.0f}..{box.y1:.0f} px in a {width:.0f} x {height:.0f} px figure)")
        boxes.append(box)
    for i, a in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            b = boxes[j]
            dx = min(a.x1, b.x1) - max(a.x0, b.x0)
            dy = min(a.y1, b.y1) - max(a.y0, b.y0)
            if dx > _SLACK and dy > _SLACK:
                defects.append(f"texts {_name(texts[i])} and {_name(texts[j])} overlap ({dx:.0f} x {dy:.0f} px)")
    for k, ax in enumerate(fig.axes):
        labels = set(ax.get_legend_handles_labels()[1])
        if len(labels) > max_series:
            defects.append(f"axes {k} ({ax.get_title()!r}) has {len(labels)} labelled series (over {max_series})")
    defects += _unlabelled_axes(fig, renderer)
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    for legend in legends:
        entries = [t for t in legend.get_texts() if t.get_text().strip()]
        if len(entries) > max_series:
            defects.append(f"a legend has {len(entries)} entries (over {max_series})")
    return defects


def _unlabelled_axes(fig, renderer) -> list[str]:
    """Axes whose x (y) axis draws tick labels with no label on it, on a panel above or below (beside) it, or on the
    figure."""
    axes = [ax for ax in fig.axes if ax.get_visible() and not ax.images]
    boxes = {id(ax): ax.get_window_extent(renderer) for ax in axes}
    sup = {"x": bool(fig._supxlabel and fig._supxlabel.get_text()), "y": bool(fig._supylabel and fig._supylabel.get_text())}
    out = []
    for k, ax in enumerate(axes):
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            drawn = [t for t in axis._update_ticks() if t.label1.get_visible() and t.label1.get_text().strip()
                     or t.label2.get_visible() and t.label2.get_text().strip()]
            if not drawn or axis.label.get_text().strip() or sup[name]:
                continue
            box = boxes[id(ax)]
            lo, hi = (box.x0, box.x1) if name == "x" else (box.y0, box.y1)
            shared = [o for o in axes if o is not ax and (getattr(o, f"{name}axis").label.get_text().strip())
                      and min(hi, (boxes[id(o)].x1 if name == "x" else boxes[id(o)].y1))
                      - max(lo, (boxes[id(o)].x0 if name == "x" else boxes[id(o)].y0)) > 0.5 * (hi - lo)]
            if not shared:
                out.append(f"axes {k} ({ax.get_title()!r}): the {name} axis has tick labels and no label")
    return out
