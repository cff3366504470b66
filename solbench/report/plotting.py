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
PHASE_COLOURS = {
    "explore": "#ff7f0e", "select": "#ffbb78", "regenerate": "#d62728", "rollout": "#1f77b4",
    "reward": "#9467bd", "train": "#2ca02c", "sync": "#8c564b",
}
_LINESTYLES = ["-", "--", ":", "-."]


def new_figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    return fig


def arm_styles(arms: list[str], methods: dict[str, str]) -> dict[str, dict]:
    """Colour by method, line style cycling over the arms of the same method."""
    styles, seen, fallback = {}, {}, iter(_FALLBACK * 10)
    extra: dict[str, str] = {}
    for arm in arms:
        display = method_display(methods.get(arm, arm))
        colour = _METHOD_COLOURS.get(display) or extra.setdefault(display, next(fallback))
        count = seen.get(display, 0)
        seen[display] = count + 1
        if count:  # a second arm of the same method: vary the shade and the line style
            colour = _shade(colour, count)
        styles[arm] = {"color": colour, "linestyle": _LINESTYLES[count % len(_LINESTYLES)]}
    return styles


def _shade(colour: str, k: int) -> str:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    f = 0.55 ** k
    return "#{:02x}{:02x}{:02x}".format(*(int(255 * (1 - (1 - c) * f)) for c in (r, g, b)))


def phase_colour(phase: str, index: int) -> str:
    return PHASE_COLOURS.get(phase, _FALLBACK[index % len(_FALLBACK)])
