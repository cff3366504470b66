"""Power of the Findings' claims: the smallest effect each design detects, and the design that would detect the
paper's (docs/reports.md, "Power").

A paired comparison's differences d[seed, prompt] have variance components (``stats.variance_components``: run
seeds, eval prompts, residual, each truncated at zero as the interval truncates them). At S run seeds and P prompts
the grand mean has SE(S, P) = sqrt(s2_seed / S + s2_prompt / P + s2_e / (S P)), with Satterthwaite's degrees of
freedom from the expected mean squares. A verdict needs the interval wholly on one side of the threshold, so:

- ``mde`` = (t(0.975, df) + t(0.80, df)) x SE(S, P): the smallest distance of the true effect from the threshold that
  the 95 % interval excludes the threshold with 80 % power, at this design;
- ``seeds_needed``: the smallest S (at the current P) with mde(S, P) <= the target distance;
- ``prompts_needed`` (where the prompt term carries more of the variance than the seed term): the smallest P (at the
  current S) with mde(S, P) <= the target distance.

The target distance is |target - threshold|: the target is the paper's effect where the paper has a figure for the
claim, carried over to this reward as a relative change of its baseline score (``PAPER_EFFECT``; Table 8's target is
the paper's ρ itself), else the observed effect. With fewer than three run seeds the seed term is not estimated and
``seeds_needed`` is empty (the note says to run three).
"""

from __future__ import annotations

import math

from solbench.report.findings_common import Finding, fmt_value
from solbench.report.stats import POWER, ratio_power, ratio_t, units_needed

#: claim -> (the paper's effect, "rel" (a relative change) or "abs" (in the finding's own unit), where it comes from)
PAPER_EFFECT = {
    "Sol-RL beats DiffusionNFT at equal PROJECTED GPU time": (0.3688 / 0.3613 - 1, "rel", "Table 1 HPSv2 +2.1 %"),
    "Sol-RL beats DiffusionNFT at equal iterations": (0.3688 / 0.3613 - 1, "rel", "Table 1 HPSv2 +2.1 %"),
    "More explore steps (up to 6) give a better policy": (0.3686 / 0.3587 - 1, "rel", "Table 2 HPSv2 +2.8 %"),
    "Reward grows with the candidate pool N at fixed K": (0.3686 / 0.3569 - 1, "rel", "Table 3 HPSv2 +3.3 %"),
    "Sol-RL matches naive BF16 scaling (non-inferior)": (-0.0029, "rel", "Table 6 FLUX gap -0.29 %"),
    "Naive FP4 ends below Sol-RL (at naive FP4's end)": (0.36 / 0.3688 - 1, "rel", "naive FP4's HPSv2 peak -2.4 %"),
    "Naive FP4 ends below Sol-RL (equal iterations)": (0.36 / 0.3688 - 1, "rel", "naive FP4's HPSv2 peak -2.4 %"),
}
#: claims that start with these get the paper's effect too (one row per checkpoint or recipe)
PAPER_EFFECT_PREFIX = {
    "Images of the FP4 explore copy score as well as full precision": (27.44 / 27.10 - 1, "rel",
                                                                       "Table 4 FLUX CLIP +1.25 %"),
    "FP4 explore ranks seeds almost as BF16 does": (0.927, "abs", "Table 8 ρ 0.927"),
}


def _paper_effect(f: Finding):
    if f.claim in PAPER_EFFECT:
        return PAPER_EFFECT[f.claim]
    return next((v for prefix, v in PAPER_EFFECT_PREFIX.items() if f.claim.startswith(prefix)), None)


def target_distance(f: Finding) -> tuple[float, str]:
    """(|target - threshold|, where the target comes from) in the finding's unit; NaN when there is none."""
    paper = _paper_effect(f)
    if paper is not None:
        value, kind, source = paper
        if kind == "abs" or f.unit == "rel":
            return abs(value - f.threshold), f"the paper's effect ({source})"
        if math.isfinite(f.base_mean) and f.base_mean:
            return (abs(value * abs(f.base_mean) - f.threshold),
                    f"the paper's effect ({source}) as a relative change of this reward's baseline "
                    f"{abs(f.base_mean):.4f}")
    if math.isfinite(f.effect) and math.isfinite(f.threshold):
        return abs(f.effect - f.threshold), "the observed effect (no paper figure for it)"
    return math.nan, ""


def add_power(f: Finding) -> Finding:
    """Fill ``mde``, ``seeds_needed``, ``prompts_needed`` and ``power_note`` from the finding's variance components."""
    c = f.components
    if c is None or not math.isfinite(f.threshold):
        return f
    f.mde = c.detectable(c.n_seeds, c.n_prompts)
    distance, source = target_distance(f)
    if not math.isfinite(distance):
        return f
    unit = "rho" if f.unit == "rho" else f.unit
    f.power_note = f"target {fmt_value(distance, unit).lstrip('+')} from the threshold: {source}"
    if math.isnan(c.seed):
        f.power_note += ("; seeds needed not estimated: fewer than 3 run seeds leave the seed-to-seed variance "
                         "unknown (run 3 or more)" if c.n_prompts > 1 else "")
    else:
        f.seeds_needed = units_needed(c, distance, vary="seeds")
    if (c.prompts_dominate or math.isinf(f.seeds_needed)) and c.n_prompts > 1:  # and where seeds alone cannot
        f.prompts_needed = units_needed(c, distance, vary="prompts") if not math.isnan(c.seed) else math.nan
    return f


#: the machine a "what would decide it" cost is stated for: the embedded world's laptop (2 cores, one run per core)
CORES = 2


def _seeds_have(f: Finding) -> int:
    """The run seeds the row's design has: its paired design's, or each arm's of a measured speedup."""
    return f.components.n_seeds if f.components is not None else f.n_arm_seeds


def add_cost(f: Finding) -> Finding:
    """``decide_h``: the hours on CORES cores that the seeds_needed design adds to these results (the missing run
    seeds of the compared arms, at their measured cost per seed), where a seed count reaches the target."""
    have = _seeds_have(f)
    if math.isfinite(f.seeds_needed) and math.isfinite(f.seed_cost_s) and have:
        f.decide_h = max(0.0, f.seeds_needed - have) * f.seed_cost_s / CORES / 3600
    return f


def cost_text(f: Finding) -> str:
    """' (about 3.1 h more on 2 cores: 12 more run seeds of the compared arms at 31.0 core-min a seed)' or ''."""
    if not math.isfinite(f.decide_h):
        return ""
    more = int(f.seeds_needed - _seeds_have(f))
    if more <= 0:
        return " (this design has them)"
    span = f"{f.decide_h:.1f} h" if f.decide_h >= 1 else f"{f.decide_h * 60:.0f} min"
    return (f" (about {span} more on {CORES} cores: {more} more run seed{'s' if more != 1 else ''} of the compared "
            f"arms at {f.seed_cost_s / 60:.1f} core-min a seed)")


def add_ratio_power(f: Finding, base, target) -> Finding:
    """A measured speedup's power (Table 5: run seeds of two arms, ``stats.ratio_power``) toward the observed ratio:
    the paper's figures are GPU clocks, not this machine's, so the target is what this clock showed."""
    if not (math.isfinite(f.effect) and f.effect > 0):
        return f
    distance = abs(f.effect - 1.0)
    f.df = ratio_t(base, target)[2]  # the log ratio's t interval (findings_multiplicity's p value)
    f.mde, f.seeds_needed = ratio_power(base, target, distance)
    f.n_arm_seeds = min(len(base), len(target))
    if math.isfinite(f.mde):
        f.power_note = (f"target {f.effect:.2f}x (the observed speedup; the paper's figures are GPU clocks), "
                        f"{len(base)} and {len(target)} seeds of the two arms")
    return f


def _count(value: float, what: str) -> str:
    return f"{int(value)} {what}" if math.isfinite(value) else f"more than 1000 {what}"


def power_cell(f: Finding) -> str:
    """The Findings table's power cell: mde and the seeds (and prompts) a decision would take."""
    if not math.isfinite(f.mde):
        return "-"
    c = f.components
    if c is None:  # a ratio of two arms' independent seeds (add_ratio_power)
        need = _count(f.seeds_needed, "seeds per arm") if not math.isnan(f.seeds_needed) else "-"
        return (f"mde {1 + f.mde:.2f}x at this design; {need}{cost_text(f)} for a {f.power_note} "
                f"({POWER * 100:.0f} % power, 5 % level)")
    unit = "rho" if f.unit == "rho" else f.unit
    text = f"mde {fmt_value(f.mde, unit).lstrip('+')} at {c.n_seeds} seed{'s' if c.n_seeds != 1 else ''} x {c.n_prompts} prompts"
    if not f.power_note:
        return text
    if math.isnan(c.seed):
        return text + "; " + f.power_note
    text += f"; {_count(f.seeds_needed, 'seeds')} (at {c.n_prompts} prompts){cost_text(f)} for a {f.power_note}"
    if c.prompts_dominate:
        text += f"; prompts dominate the variance: {_count(f.prompts_needed, 'prompts')} (at {c.n_seeds} seeds)"
    elif math.isinf(f.seeds_needed) and not math.isnan(f.prompts_needed):
        text += f"; or {_count(f.prompts_needed, 'prompts')} (at {c.n_seeds} seeds)"
    return text + f" ({POWER * 100:.0f} % power, 5 % level)"
