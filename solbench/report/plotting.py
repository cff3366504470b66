"""Plotting helpers shared by the figure plugins (matplotlib without pyplot: no global state, Agg).

Figures are built with ``matplotlib.figure.Figure`` directly, so report generation never opens a
window, never touches pyplot's global figure list and works in threads and headless jobs.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)

from matplotlib.figure import Figure  # noqa: E402

from solbench.report.tables import method_display  # noqa: E402

#: One colour per method, the only colour it is drawn in, in every chart (issue 52). A method's further arms
#: (ablations, other horizons, other explore copies) are told apart by facets or direct labels, never by a second
#: colour of the same family.
METHOD_COLOURS = {
    "Base": "#7f7f7f", "DanceGRPO": "#9467bd", "FlowGRPO": "#8c564b", "AWM": "#e377c2",
    "DiffusionNFT": "#1f77b4", "Sol-RL": "#d62728", "naive BF16 scaling": "#2ca02c", "naive FP4": "#ff7f0e",
}
_METHOD_COLOURS = METHOD_COLOURS  # the name solbench/report/headline.py imports
#: a marker per method, so that two methods on the same values stay visible (the hidden Sol-RL line, issue 52)
METHOD_MARKERS = {"Base": "o", "DanceGRPO": "v", "FlowGRPO": "^", "AWM": "D", "DiffusionNFT": "s", "Sol-RL": "o",
                  "naive BF16 scaling": "P", "naive FP4": "X"}
#: colours of anything that is not a method of the paper (an unknown method, a fidelity series): none of the above
_FALLBACK = ["#17becf", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]
#: line styles of a method's further arms where a chart draws them beside its headline arm
_LINESTYLES = ["--", ":", "-."]
PHASE_COLOURS = {
    # select in cyan: no shade of explore's orange (issue 48: the two read as one colour)
    "explore": "#ff7f0e", "select": "#17becf", "regenerate": "#d62728", "rollout": "#1f77b4",
    "reward": "#9467bd", "train": "#2ca02c", "sync": "#8c564b",
}
#: most labelled series an axes carries; beyond it a chart facets (issue 52)
MAX_SERIES = 8
#: an arm with this many run seeds or fewer shows each seed's own points (a t band over so few covers the chart)
SEED_POINTS_UP_TO = 5
#: longest label (an arm, a metric, a recipe) drawn in a chart: a 10 MB name costs no more than a short one
LABEL_CHARS = 60
#: text sizes (points at the saved size; nothing under 7, issue 52)
SMALL, NORMAL, TITLE = 7.5, 8.5, 10


def clip(text, limit: int = LABEL_CHARS) -> str:
    """``text`` as a string of at most ``limit`` characters, cut with an ellipsis (before it reaches matplotlib:
    laying out a 10 MB string costs seconds and memory, issue 56); newlines folded to spaces."""
    text = str(text)
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return text.replace("\n", " ")


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig


def headline_arms(tables, runs) -> set[str]:
    """Each method's headline arm (the one the Findings compare: most seeds, settings at their defaults)."""
    from solbench.report.findings_common import main_arm

    return {arm for method in runs["method"].dropna().unique() if (arm := main_arm(tables, runs, method))}


def headline_order(tables, runs) -> list[str]:
    """The headline arms of ``runs`` in the paper's method order."""
    heads = headline_arms(tables, runs)
    return [a for a in tables.arm_order(runs) if a in heads]


def arm_labels(tables, arms) -> dict[str, str]:
    """{arm: its short label (solbench/report/labels.py: "Sol-RL N=8"), clipped to LABEL_CHARS}."""
    from solbench.report.labels import short_labels

    short = short_labels(tables)
    return {arm: clip(short.get(arm, arm)) for arm in arms}


def method_colour(method: str, index: int = 0) -> str:
    """The colour of a method (registry or display name); an unknown method a colour no paper method has."""
    return METHOD_COLOURS.get(method_display(method)) or _FALLBACK[index % len(_FALLBACK)]


def arm_styles(arms: list[str], methods: dict[str, str], headline: set[str] | None = None) -> dict[str, dict]:
    """A style per arm: every arm in its method's one colour and marker (``METHOD_COLOURS``); the headline arm of
    each method (``headline``; default: its first arm) with a thick solid line, a further arm with a thin dashed or
    dotted one. Charts draw further arms in panels of their own (or label them directly), never by colour."""
    styles, seen, unknown = {}, {}, {}
    headline = set(headline or ())
    ordered = sorted(arms, key=lambda a: (a not in headline, arms.index(a)))  # headline arms take variant 0
    for arm in ordered:
        display = method_display(methods.get(arm, arm))
        colour = METHOD_COLOURS.get(display) or _FALLBACK[unknown.setdefault(display, len(unknown)) % len(_FALLBACK)]
        marker = METHOD_MARKERS.get(display, "o")
        count = seen.get(display, 0)
        seen[display] = count + 1
        if count:
            styles[arm] = {"color": colour, "linestyle": _LINESTYLES[(count - 1) % len(_LINESTYLES)], "linewidth": 1.3,
                           "marker": marker, "zorder": 2}
        else:
            styles[arm] = {"color": colour, "linestyle": "-", "linewidth": 2.2, "marker": marker,
                           "zorder": 4 if display == "Sol-RL" else 3}
    return {arm: styles[arm] for arm in arms}


def seed_points(ax, x, y, colour: str, zorder: float = 2.5) -> None:
    """Each run seed's own values as small dots in the arm's colour, unlabelled (the mean line names the arm)."""
    ax.plot(x, y, linestyle="none", marker="o", markersize=2.6, color=colour, alpha=0.55, markeredgewidth=0,
            zorder=zorder, label="_seed")


def legend_below(fig, handles, labels, *, ncols: int | None = None, title: str | None = None) -> None:
    """A figure legend below the panels, outside the data (constrained layout keeps it inside the saved figure)."""
    if not labels:
        return
    ncols = ncols or min(len(labels), 4)
    fig.legend(handles, [clip(t) for t in labels], loc="outside lower center", ncols=ncols, fontsize=NORMAL,
               frameon=False, title=title, title_fontsize=NORMAL)


def legend_entries(axes) -> tuple[list, list[str]]:
    """(handles, labels) of every labelled series of ``axes`` (an array or list of them), the first of each label."""
    import numpy as np

    found: dict = {}
    for ax in np.asarray(axes).flat:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            found.setdefault(name, handle)
    return list(found.values()), list(found)


def style_axes(ax, xlabel: str, ylabel: str, *, title: str | None = None) -> None:
    """Axis labels (with their unit), readable ticks and a light grid."""
    ax.set_xlabel(clip(xlabel, 2 * LABEL_CHARS), fontsize=NORMAL)
    ax.set_ylabel(clip(ylabel, 2 * LABEL_CHARS), fontsize=NORMAL)
    if title is not None:
        ax.set_title(clip(title, 2 * LABEL_CHARS), fontsize=NORMAL)
    ax.tick_params(labelsize=SMALL)
    ax.grid(alpha=0.3)


def label_points(ax, xs, ys, texts, *, fontsize: float = SMALL) -> None:
    """Label each point (``xs``, ``ys`` in data units) beside it, no label over another, the legend or the axes' edge.

    Labels are placed left to right: each tries the spot right of and above its point, then steps of its own height
    up and down, then the same left of the point, and takes the first spot that overlaps nothing placed before it
    (matplotlib's own text extents on an Agg canvas, the way tests/_chart_checks.py measures them); where every spot
    is taken it keeps the first. A direct label can then never hide another, as staggered offsets did on crowded
    sweep fronts."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()  # lays the figure out (constrained layout) so that data -> pixels is final
    renderer = canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = [legend.get_window_extent(renderer) for legend in [ax.get_legend()] if legend is not None]
    points = sorted(zip(xs, ys, texts), key=lambda p: (p[0], p[1]))
    for x, y, text in points:
        label = ax.annotate(clip(text), (x, y), textcoords="offset points", xytext=(5, 3), fontsize=fontsize,
                            bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                                  "alpha": 0.8})  # legible over the other points' bars
        height = label.get_window_extent(renderer).height * 72.0 / fig.dpi + 1.0
        width = label.get_window_extent(renderer).width * 72.0 / fig.dpi
        spots = [(dx, 3 + height * k) for dx in (5, -5 - width) for k in (0, 1, -1, 2, -2, 3, -3)]
        for spot in spots:
            label.set_position(spot)
            box = label.get_window_extent(renderer)
            inside = (box.x0 >= frame.x0 and box.x1 <= frame.x1 and box.y0 >= frame.y0 and box.y1 <= frame.y1)
            if inside and not any(box.overlaps(other) for other in taken):
                break
        else:
            label.set_position(spots[0])
            box = label.get_window_extent(renderer)
        taken.append(box)


def int_ticks(ax, axis: str = "x") -> None:
    """Integer tick labels on an axis of whole numbers (iterations, N, steps)."""
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def phase_colour(phase: str, index: int) -> str:
    return PHASE_COLOURS.get(phase, _FALLBACK[index % len(_FALLBACK)])
