"""Plotting helpers shared by the figure plugins (matplotlib without pyplot: no global state, Agg).

Figures are built with ``matplotlib.figure.Figure`` directly, so report generation never opens a
window, never touches pyplot's global figure list and works in threads and headless jobs.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg", force=False)

from matplotlib.figure import Figure  # noqa: E402

from solbench.report.tables import method_display  # noqa: E402

# Stable colours per method (the same method has the same colour in every figure).
_METHOD_COLOURS = {
    "Base": "#7f7f7f", "DanceGRPO": "#9467bd", "FlowGRPO": "#8c564b", "AWM": "#e377c2",
    "DiffusionNFT": "#1f77b4", "Sol-RL": "#d62728", "naive BF16 scaling": "#2ca02c", "naive FP4": "#ff7f0e",
}
_FALLBACK = ["#17becf", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173"]
# Colours of a method's further arms (ablations, other horizons): hues at least 20 degrees apart from each other,
# none a shade of a method's colour, so that seven Sol-RL arms are seven colours, not seven reds (issue 42)
_ARM_COLOURS = ["#17becf", "#bcbd22", "#393b79", "#1b9e77", "#a6761d", "#66a61e", "#e7298a", "#000000"]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h"]
PHASE_COLOURS = {
    # select in cyan: no shade of explore's orange (issue 48: the two read as one colour)
    "explore": "#ff7f0e", "select": "#17becf", "regenerate": "#d62728", "rollout": "#1f77b4",
    "reward": "#9467bd", "train": "#2ca02c", "sync": "#8c564b",
}
_LINESTYLES = ["-", "--", ":", "-."]


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig


def headline_arms(tables, runs) -> set[str]:
    """Each method's headline arm (the one the Findings compare: most seeds, settings at their defaults)."""
    from solbench.report.findings_common import main_arm

    return {arm for method in runs["method"].dropna().unique() if (arm := main_arm(tables, runs, method))}


def arm_styles(arms: list[str], methods: dict[str, str], headline: set[str] | None = None) -> dict[str, dict]:
    """A style per arm, every arm distinguishable: the headline arm of each method (``headline``; default: its
    first arm) in the method's own colour with a thick solid line and round markers; every further arm in a colour
    of its own (``_ARM_COLOURS``, distinct hues, in turn over the whole figure), with its own marker and a
    dashed or dotted line."""
    styles, seen, fallback = {}, {}, iter(_FALLBACK * 10)
    extra: dict[str, str] = {}
    others = iter(range(10 ** 6))
    headline = set(headline or ())
    ordered = sorted(arms, key=lambda a: (a not in headline, arms.index(a)))  # headline arms take variant 0
    for arm in ordered:
        display = method_display(methods.get(arm, arm))
        colour = _METHOD_COLOURS.get(display) or extra.setdefault(display, next(fallback))
        count = seen.get(display, 0)
        seen[display] = count + 1
        if count:  # a further arm of the same method: a colour, marker and line style of its own
            k = next(others)
            colour = _ARM_COLOURS[k % len(_ARM_COLOURS)]
            if k >= len(_ARM_COLOURS):  # more arms than colours: the second round is darker
                colour = _variant(colour, 1)
            styles[arm] = {"color": colour, "linestyle": _LINESTYLES[1 + k % (len(_LINESTYLES) - 1)],
                           "linewidth": 1.3, "marker": _MARKERS[(k + 1) % len(_MARKERS)], "zorder": 2}
        else:
            styles[arm] = {"color": colour, "linestyle": "-", "linewidth": 2.2, "marker": "o", "zorder": 3}
    return {arm: styles[arm] for arm in arms}


def _variant(colour: str, k: int) -> str:
    """The k-th variant of a colour: alternately darker and lighter, by at most 45 % (never near white)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    amount = min(0.15 * ((k + 1) // 2), 0.45)
    target = 0.0 if k % 2 else 1.0  # odd: toward black, even: toward white
    return "#{:02x}{:02x}{:02x}".format(*(int(255 * (c + (target - c) * amount)) for c in (r, g, b)))


def int_ticks(ax, axis: str = "x") -> None:
    """Integer tick labels on an axis of whole numbers (iterations, N, steps)."""
    from matplotlib.ticker import MaxNLocator

    (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))


def phase_colour(phase: str, index: int) -> str:
    return PHASE_COLOURS.get(phase, _FALLBACK[index % len(_FALLBACK)])
