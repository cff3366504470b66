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
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return float(lo), float(hi)


def fmt_num(value: float, digits: int = 4) -> str:
    """A number for a Markdown table: ``digits`` decimals, scientific for very large/small, '-' for NaN."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-" if value is None or math.isnan(value) else ("inf" if value > 0 else "-inf")
    value = float(value)
    if value != 0 and (abs(value) >= 1e6 or abs(value) < 10 ** (-digits)):
        return f"{value:.{max(digits - 1, 1)}e}"
    return f"{value:.{digits}f}"


def fmt_ci(ci: CI, digits: int = 4) -> str:
    """'mean ± half-width' (or just the mean when there is no interval)."""
    if not math.isfinite(ci.mean):
        return "-"
    if not math.isfinite(ci.lo):
        return fmt_num(ci.mean, digits)
    return f"{fmt_num(ci.mean, digits)} ± {fmt_num(ci.half_width, digits)}"
