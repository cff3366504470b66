"""Small statistics used by the report plugins: t-based confidence intervals and the bootstrap.

Conventions (stated in every report caption that uses them):
- ``mean_ci``: mean over independent units (seeds, prompt groups) with a two-sided Student-t
  interval, mean +- t_{(1+level)/2, n-1} * sd / sqrt(n) (sd with ddof=1). One unit gives no interval
  (NaN), never a zero-width one.
- ``bootstrap_ci``: percentile interval of a statistic recomputed on resamples drawn with
  replacement, independently per group; deterministic for a given seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class CI:
    """A mean (or point estimate) with its interval and the number of units behind it."""

    mean: float
    lo: float
    hi: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2.0


def mean_ci(values: Sequence[float] | np.ndarray, level: float = 0.95) -> CI:
    """Mean and two-sided t interval of the finite ``values`` (NaNs dropped)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return CI(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n == 1:
        return CI(mean, math.nan, math.nan, 1)
    sd = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n)
    return CI(mean, mean - half, mean + half, n)


def bootstrap_ci(groups: Sequence[np.ndarray], statistic: Callable[..., float], *, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile interval of ``statistic(*groups)`` under independent resampling of each group.

    Every group is resampled with replacement to its own size. A group of size 1 cannot be
    resampled meaningfully, so then the interval is (NaN, NaN). Non-finite statistics of a resample
    (e.g. a method that never reaches a target) are kept as they are: ``inf`` sorts to the top and
    NaNs are dropped.
    """
    arrays = [np.asarray(g) for g in groups]
    if any(len(a) < 2 for a in arrays):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    values = np.empty(n_boot)
    for b in range(n_boot):
        sample = [a[rng.integers(0, len(a), len(a))] for a in arrays]
        values[b] = statistic(*sample)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return math.nan, math.nan
    alpha = (1.0 - level) / 2.0
    with np.errstate(invalid="ignore"):
        lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    if np.isnan(lo) or np.isnan(hi):  # interpolating between infinite resamples: take the nearest resample
        lo, hi = np.quantile(values, [alpha, 1.0 - alpha], method="nearest")
    return float(lo), float(hi)


def fmt_num(value: float, digits: int = 4) -> str:
    """A number for a Markdown table: ``digits`` decimals, scientific for very large/small, '-' for NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None or math.isnan(value) else ("∞" if value > 0 else "-∞")
    value = float(value)
    if abs(value) < 1e-12:  # float rounding's residue of an exact zero (a mean of +x and -x), not a number to print
        value = 0.0
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 10 ** (-digits)):
        return f"{value:.{max(digits - 1, 1)}e}"
    return f"{value:.{digits}f}"


def fmt_ci(ci: CI, digits: int = 4) -> str:
    """'mean ± half-width' (or just the mean when there is no interval)."""
    if not math.isfinite(ci.mean):
        return "-"
    if not math.isfinite(ci.lo):
        return fmt_num(ci.mean, digits)
    if round(ci.half_width, digits) == 0:  # no spread at these digits: "0.688 ± 0.000" would read as a measured zero
        return f"{fmt_num(ci.mean, digits)} (no spread over {ci.n} units)"
    return f"{fmt_num(ci.mean, digits)} ± {fmt_num(ci.half_width, digits)}"


def clip_ci(ci: CI, lower: float = 0.0, upper: float = math.inf) -> CI:
    """``ci`` with its bounds clipped to the range a count or a proportion can take (a t interval of a few seeds
    otherwise reaches below zero: issue 48)."""
    if not math.isfinite(ci.lo):
        return ci
    return CI(ci.mean, min(max(ci.lo, lower), upper), min(max(ci.hi, lower), upper), ci.n)


def fmt_bounded_ci(ci: CI, digits: int = 3) -> str:
    """'mean [lo, hi]' of a clipped interval (``clip_ci``: no longer symmetric, so no '±')."""
    if not math.isfinite(ci.mean):
        return "-"
    if not math.isfinite(ci.lo) or round(ci.hi - ci.lo, digits) == 0:
        return fmt_ci(ci, digits)
    return f"{fmt_num(ci.mean, digits)} [{fmt_num(ci.lo, digits)}, {fmt_num(ci.hi, digits)}]"


#: Run seeds from which the seed-to-seed variance of a paired difference is estimated (docs/reports.md,
#: "Paired comparisons"): with fewer, intervals rest on the eval prompts alone and say so.
MIN_SEEDS_FOR_SEED_VARIANCE = 3


@dataclass(frozen=True)
class PairedCI:
    """A paired difference, its interval and what the interval covers (``crossed_interval``)."""

    mean: float
    lo: float
    hi: float
    n_seeds: int
    n_prompts: int  # eval prompts common to every seed; 0: per-run values only (no per-prompt eval rows)
    df: float = math.nan  # degrees of freedom of the t quantile
    per_seed: tuple[float, ...] = ()  # each run seed's mean difference, in seed order
    components: "Components | None" = None  # the design's variance components (``variance_components``)

    @property
    def seed_variance_estimated(self) -> bool:
        """Whether the interval covers run-to-run variation (3+ seeds, or 2+ per-run values)."""
        return self.n_seeds >= MIN_SEEDS_FOR_SEED_VARIANCE or (self.n_prompts == 0 and self.n_seeds >= 2)

    @property
    def covers(self) -> str:
        """What the interval covers, for captions."""
        if self.n_prompts == 0:
            return (f"run seeds only ({self.n_seeds} paired runs, t interval; no per-prompt eval rows)" if self.n_seeds > 1
                    else "nothing (one paired run and no per-prompt eval rows)")
        if not self.seed_variance_estimated:
            return (f"eval prompts only ({self.n_prompts} prompts x {self.n_seeds} run seed{'s' if self.n_seeds > 1 else ''}): "
                    "seed-to-seed variance not estimated")
        return f"run seeds ({self.n_seeds}) crossed with eval prompts ({self.n_prompts}), both random"


def crossed_interval(x, level: float = 0.95) -> tuple[float, float, float, float]:
    """(mean, lo, hi, df) of the grand mean of ``x`` [seeds, prompts]: paired differences of run seeds
    crossed with the same eval prompts, both drawn at random (a two-way random-effects model
    d = mu + seed + prompt + residual).

    Mean squares of the two-way layout without replication (MS_S, MS_P, MS_E); the variance of the grand
    mean is sigma_seed^2 / S + sigma_prompt^2 / P + sigma_e^2 / (S P), estimated with each variance
    component truncated at zero, i.e. [max(MS_S, MS_E) + max(MS_P, MS_E) - MS_E] / (S P), and a Student t
    interval with Satterthwaite's degrees of freedom. One prompt column: a t interval over the seeds;
    one seed row: a t interval over the prompts. Fewer than ``MIN_SEEDS_FOR_SEED_VARIANCE`` seeds (and more
    than one prompt): the seed term is not estimated; the interval is over the prompts of the seed means
    (seeds held fixed), which is what those runs can carry. A single value gives no interval (NaN).
    tests/test_report_intervals.py shows its coverage by simulation.
    """
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    s, p = x.shape
    mean = float(x.mean()) if x.size else math.nan
    if x.size <= 1:
        return mean, math.nan, math.nan, math.nan
    if np.ptp(x) == 0:  # every difference equal: no spread at all (verdict refuses the zero width)
        return mean, mean, mean, math.inf
    if p == 1 or s == 1 or s < MIN_SEEDS_FOR_SEED_VARIANCE:
        units = x[:, 0] if p == 1 else x.mean(axis=0)  # one value per seed, or per prompt
        ci = mean_ci(units, level)
        return mean, ci.lo, ci.hi, float(units.size - 1)
    rows, cols = x.mean(axis=1), x.mean(axis=0)
    ms_s = p * float(((rows - mean) ** 2).sum()) / (s - 1)
    ms_p = s * float(((cols - mean) ** 2).sum()) / (p - 1)
    resid = x - rows[:, None] - cols[None, :] + mean
    df_e = (s - 1) * (p - 1)
    ms_e = float((resid ** 2).sum()) / df_e
    c_s, c_p = float(ms_s >= ms_e), float(ms_p >= ms_e)  # a truncated component leaves MS_E in its place
    terms = [(c_s * ms_s, s - 1), (c_p * ms_p, p - 1), ((1.0 - c_s - c_p) * ms_e, df_e)]
    terms = [(t, d) for t, d in terms if t != 0.0]
    total = sum(t for t, _ in terms)
    if total <= 0:
        return mean, mean, mean, math.inf  # every difference equal: no spread (verdict refuses it)
    df = total ** 2 / sum(t * t / d for t, d in terms)
    half = float(stats.t.ppf(0.5 + level / 2.0, df)) * math.sqrt(total / (s * p))
    return mean, mean - half, mean + half, float(df)


def hierarchical_bootstrap(groups: Sequence[Sequence[float]], *, n_boot: int = 2000, level: float = 0.95,
                           seed: int = 0) -> tuple[float, float, float, np.ndarray]:
    """Two-level percentile bootstrap of the grand mean of ``groups`` (one group per run seed, one value
    per eval prompt in it): resample the groups with replacement, then, within every drawn group
    independently, its values with replacement; the statistic is the mean of all drawn values.

    Returns (point estimate = mean of all values, lo, hi, the ``n_boot`` replicates). Deterministic for
    a given ``seed``. One group: only its values are resampled. Groups of one value each: only the
    groups are resampled. A single value gives no interval (NaN), never a zero-width one.
    """
    arrays = [np.asarray(g, dtype=float) for g in groups]
    arrays = [a[np.isfinite(a)] for a in arrays]
    arrays = [a for a in arrays if a.size]
    if not arrays:
        return math.nan, math.nan, math.nan, np.empty(0)
    point = float(np.concatenate(arrays).mean())
    if len(arrays) == 1 and arrays[0].size == 1:
        return point, math.nan, math.nan, np.empty(0)
    rng = np.random.default_rng(seed)
    n_groups = len(arrays)
    picks = rng.integers(0, n_groups, size=(n_boot, n_groups))  # which group fills each slot
    sums = np.zeros(n_boot)
    counts = np.zeros(n_boot)
    for slot in range(n_groups):
        for g, values in enumerate(arrays):
            rows = np.flatnonzero(picks[:, slot] == g)
            if rows.size == 0:
                continue
            draws = values[rng.integers(0, values.size, size=(rows.size, values.size))]
            sums[rows] += draws.sum(axis=1)
            counts[rows] += values.size
    replicates = sums / counts
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(replicates, [alpha, 1.0 - alpha])
    return point, float(lo), float(hi), replicates


def paired_ci(matrix, *, level: float = 0.95, per_prompt: bool = True) -> PairedCI:
    """``crossed_interval`` of paired differences ``matrix`` [run seeds, eval prompts] (rows in seed order;
    ``per_prompt`` False: one column of per-run differences), as a PairedCI."""
    x = np.asarray(matrix, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    mean, lo, hi, df = crossed_interval(x, level) if x.size else (math.nan,) * 4
    return PairedCI(mean, lo, hi, int(x.shape[0]), int(x.shape[1]) if per_prompt else 0, df,
                    tuple(float(v) for v in x.mean(axis=1)) if x.size else (),
                    variance_components(x) if per_prompt else variance_components(x.T))


# ---- power: the smallest effect a design detects, and the design that would detect a given one ---------------

#: Power and level of the design calculations (docs/reports.md, "Power").
POWER, ALPHA = 0.80, 0.05


@dataclass(frozen=True)
class Components:
    """Variance components of a paired difference d = mu + seed + prompt + residual, from the two-way layout's mean
    squares (each truncated at zero, as ``crossed_interval`` truncates them), and the design they came from.
    ``seed`` is NaN when fewer than ``MIN_SEEDS_FOR_SEED_VARIANCE`` run seeds leave it unestimated."""

    seed: float
    prompt: float
    resid: float
    n_seeds: int
    n_prompts: int

    def se_df(self, n_seeds: int, n_prompts: int) -> tuple[float, float]:
        """Standard error of the grand mean at ``n_seeds`` x ``n_prompts`` and the Satterthwaite degrees of freedom
        of its estimate, from the expected mean squares E[MS_S] = s2_e + P s2_seed, E[MS_P] = s2_e + S s2_prompt,
        E[MS_E] = s2_e (the interval of ``crossed_interval`` at the design's own size)."""
        s, p = n_seeds, n_prompts
        seed = 0.0 if math.isnan(self.seed) else self.seed
        terms = []
        if s > 1 and seed > 0:
            terms.append((self.resid + p * seed, s - 1))
        if p > 1 and self.prompt > 0:
            terms.append((self.resid + s * self.prompt, p - 1))
        rest = 1.0 - len(terms)
        if rest and self.resid > 0:
            terms.append((rest * self.resid, max((s - 1) * (p - 1), 1)))
        total = sum(t for t, _ in terms)
        if total <= 0:
            return 0.0, math.inf
        return math.sqrt(total / (s * p)), total ** 2 / sum(t * t / d for t, d in terms)

    def detectable(self, n_seeds: int, n_prompts: int, alpha: float = ALPHA, power: float = POWER) -> float:
        """The smallest true distance from the threshold that a two-sided level-``alpha`` interval excludes the
        threshold with probability ``power``: (t(1 - alpha/2, df) + t(power, df)) x SE."""
        se, df = self.se_df(n_seeds, n_prompts)
        if se == 0:
            return 0.0
        return (float(stats.t.ppf(1 - alpha / 2, df)) + float(stats.t.ppf(power, df))) * se

    def scaled(self, k: float) -> "Components":
        """The components of the differences divided by ``k`` (a relative effect's scale)."""
        return Components(self.seed / k ** 2, self.prompt / k ** 2, self.resid / k ** 2, self.n_seeds, self.n_prompts)

    @property
    def prompts_dominate(self) -> bool:
        """The prompt term carries more of the grand mean's variance than the seed term at the design's size."""
        seed = 0.0 if math.isnan(self.seed) else self.seed
        return self.prompt / max(self.n_prompts, 1) > seed / max(self.n_seeds, 1)


def variance_components(x) -> Components | None:
    """``Components`` of a [run seeds, eval prompts] matrix of paired differences (one column: per-run values,
    the prompt term zero); None for fewer than two values."""
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    s, p = x.shape
    if x.size < 2:
        return None
    mean = float(x.mean())
    if p == 1:  # one value per run: the run-to-run variance only
        return Components(float(x[:, 0].var(ddof=1)), 0.0, 0.0, s, 1)
    if s == 1:
        return Components(math.nan, float(x[0].var(ddof=1)), 0.0, 1, p)
    rows, cols = x.mean(axis=1), x.mean(axis=0)
    ms_s = p * float(((rows - mean) ** 2).sum()) / (s - 1)
    ms_p = s * float(((cols - mean) ** 2).sum()) / (p - 1)
    ms_e = float(((x - rows[:, None] - cols[None, :] + mean) ** 2).sum()) / ((s - 1) * (p - 1))
    seed = max(ms_s - ms_e, 0.0) / p if s >= MIN_SEEDS_FOR_SEED_VARIANCE else math.nan
    if math.isnan(seed):  # the seed term not estimated: the prompt-level variance of the seed means, as the interval
        return Components(math.nan, float(x.mean(axis=0).var(ddof=1)), 0.0, 1, p)
    return Components(seed, max(ms_p - ms_e, 0.0) / s, ms_e, s, p)


def units_needed(c: Components, distance: float, *, vary: str, limit: int = 1000) -> float:
    """The smallest number of run seeds (``vary`` "seeds", prompts held) or eval prompts ("prompts", seeds held)
    whose design detects ``distance`` (``Components.detectable``); NaN when it cannot be computed (the seed term
    not estimated, no distance); inf when no number up to ``limit`` does (the other factor's term alone is too
    large: findings.csv writes inf, the page "more than 1000")."""
    if not (math.isfinite(distance) and distance > 0) or math.isnan(c.seed):
        return math.nan
    for n in range(MIN_SEEDS_FOR_SEED_VARIANCE if vary == "seeds" else 2, limit + 1):  # 3+ seeds: the seed term
        size = (n, c.n_prompts) if vary == "seeds" else (c.n_seeds, n)
        if c.detectable(*size) <= distance:
            return float(n)
    return math.inf


def ratio_power(base, target, distance: float, *, alpha: float = ALPHA, power: float = POWER,
                limit: int = 1000) -> tuple[float, float]:
    """The power of ``ratio_ci``'s design (independent run seeds of two arms, the t interval of the log ratio):
    (mde, seeds_needed). ``mde``: the smallest true distance of the ratio from 1 (ratio - 1) whose interval excludes 1
    with ``power`` at these seed counts, (t(1 - alpha/2, df) + t(power, df)) x SE of the log ratio, exponentiated;
    ``seeds_needed``: the smallest equal number of run seeds per arm whose design detects ``distance`` (a ratio of
    1 + distance), inf where none up to ``limit`` does. (NaN, NaN) with fewer than two seeds in an arm."""
    b, t = np.asarray(base, dtype=float), np.asarray(target, dtype=float)
    if len(b) < 2 or len(t) < 2 or b.mean() <= 0 or t.mean() <= 0:
        return math.nan, math.nan
    cv_b, cv_t = b.var(ddof=1) / b.mean() ** 2, t.var(ddof=1) / t.mean() ** 2  # squared coefficients of variation

    def log_mde(nb: int, nt: int) -> float:
        vb, vt = cv_b / nb, cv_t / nt
        if vb + vt == 0:
            return 0.0
        df = (vb + vt) ** 2 / (vb ** 2 / (nb - 1) + vt ** 2 / (nt - 1))
        return (float(stats.t.ppf(1 - alpha / 2, df)) + float(stats.t.ppf(power, df))) * math.sqrt(vb + vt)

    mde = math.exp(log_mde(len(b), len(t))) - 1
    if not (math.isfinite(distance) and distance > 0):
        return mde, math.nan
    goal = math.log1p(distance)
    return mde, next((float(n) for n in range(2, limit + 1) if log_mde(n, n) <= goal), math.inf)


def ratio_ci(base, target, level: float = 0.95) -> tuple[float, float]:
    """Interval of mean(base) / mean(target) over independent run seeds of each arm: a Student t interval of the
    log ratio with the delta-method standard error sqrt(s_b^2 / (n_b m_b^2) + s_t^2 / (n_t m_t^2)) and Welch's
    degrees of freedom, exponentiated. (NaN, NaN) with fewer than two seeds in an arm: a percentile bootstrap over
    2-3 seeds undercovers (docs/reports.md), so none is given."""
    ratio, se, df = ratio_t(base, target)
    if math.isnan(ratio):
        return math.nan, math.nan
    if se == 0:
        return math.exp(ratio), math.exp(ratio)
    half = float(stats.t.ppf(0.5 + level / 2, df)) * se
    return math.exp(ratio - half), math.exp(ratio + half)


def ratio_t(base, target) -> tuple[float, float, float]:
    """(log of mean(base) / mean(target), its delta-method standard error, Welch's degrees of freedom): the t
    statistic of ``ratio_ci`` (NaNs with fewer than two seeds in an arm; SE 0 and df NaN without spread)."""
    b, t = np.asarray(base, dtype=float), np.asarray(target, dtype=float)
    if len(b) < 2 or len(t) < 2 or b.mean() <= 0 or t.mean() <= 0:
        return math.nan, math.nan, math.nan
    vb, vt = b.var(ddof=1) / (len(b) * b.mean() ** 2), t.var(ddof=1) / (len(t) * t.mean() ** 2)
    ratio = math.log(b.mean() / t.mean())
    if vb + vt == 0:
        return ratio, 0.0, math.nan
    return ratio, math.sqrt(vb + vt), (vb + vt) ** 2 / (vb ** 2 / (len(b) - 1) + vt ** 2 / (len(t) - 1))


#: The verdicts of the Findings section (docs/reports.md, "Findings"). PROJECTION: a value that follows
#: from the configuration (counted FLOPs), reported with its inputs, never judged.
REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_MEASURED, PROJECTION = (
    "reproduced", "contradicted", "inconclusive", "not measured by this spec", "projection")


def zero_width(lo: float, hi: float) -> bool:
    """An interval that could not have come out otherwise: its bounds equal to float precision."""
    return math.isfinite(lo) and math.isfinite(hi) and abs(hi - lo) <= 1e-12 * max(1.0, abs(lo), abs(hi))


def verdict(lo: float, hi: float, threshold: float, direction: str = "greater") -> str:
    """The Findings rule: the paper's claim is "effect > threshold" (``direction`` "greater") or
    "effect < threshold" ("less"). Reproduced when the whole interval lies on the claim's side of the
    threshold, contradicted when it lies wholly on the other side, inconclusive when it spans (or
    touches) the threshold or there is no interval. A zero-width interval is refused (inconclusive): its
    data could not have said otherwise (a value that follows from the configuration is a PROJECTION,
    which its caller reports without a verdict)."""
    if direction not in ("greater", "less"):
        raise ValueError(f"direction must be 'greater' or 'less', got {direction!r}")
    if math.isnan(lo) or math.isnan(hi) or zero_width(lo, hi):  # infinite bounds (a speedup) are kept
        return INCONCLUSIVE
    if direction == "less":
        lo, hi, threshold = -hi, -lo, -threshold
    if lo > threshold:
        return REPRODUCED
    if hi < threshold:
        return CONTRADICTED
    return INCONCLUSIVE
