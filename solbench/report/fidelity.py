"""Ranking fidelity (the paper's Table 8): do low-precision rewards rank seeds as full precision does?

From candidates.parquet. A candidate scored at both precisions appears twice, once with precision
"explore" (the proxy reward of the low-precision rollout) and once with "full" (the same noise seed
regenerated at full precision); they are paired by (run_id, step, prompt_id, cand_idx) and, when the
table has one, ``reward_name``. A prompt group is one (run_id, step, prompt_id[, reward_name]).

Per group with at least 3 pairs:
- Kendall tau-b and Spearman rho between proxy and full rewards (scipy.stats; ties handled; a
  group with constant rewards has no correlation and is counted apart);
- top-K hit rate, K in ``options.top_k`` below the group size: |top-K by proxy & top-K by full| / K;
- contrastive-set overlap: the best_worst selection (top floor(K/2) + bottom ceil(K/2), ties by
  candidate index, as solbench.method.selection) made from proxy rewards vs from full rewards,
  |S_proxy & S_full| / K.

Two kinds of group, reported apart:
- "all seeds": every candidate has both rewards (the standalone fidelity experiment,
  ``solbench.report.fidelity_sampling``): unbiased numbers, comparable with the paper's Table 8.
- "selected only": training data of Sol-RL, where only the K selected seeds were regenerated. The
  correlations are then over the K selected seeds only, which best_worst selection draws from both
  tails of the proxy distribution: that inflates them. Hit rates are within the K; the contrastive
  overlap is replaced by the side agreement (fraction of the K that full precision puts on the same
  side, top floor(K/2) vs the rest, as the proxy did).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from solbench.report.explore import backend_label, recipe_formats, recipe_label, stored_backends
from solbench.report.plotting import arm_labels, new_figure
from solbench.report.registry import Figure, Note, Table, report_kind
from solbench.report.stats import fmt_ci, mean_ci
from solbench.report.tables import Tables

MIN_PAIRS = 3


def _order_desc(r: np.ndarray) -> np.ndarray:
    # descending, ties by lower index first (stable): the rule of solbench.method.selection
    return np.argsort(-r, kind="stable")


def top_k(r: np.ndarray, k: int) -> set[int]:
    return set(_order_desc(r)[:k].tolist())


def best_worst(r: np.ndarray, k: int) -> set[int]:
    order = _order_desc(r)
    n_best = k // 2
    n_worst = k - n_best
    return set(order[:n_best].tolist()) | set(order[len(r) - n_worst:].tolist())


def pair_candidates(candidates: pd.DataFrame) -> pd.DataFrame:
    """Explore rows joined with full rows of the same candidate: one row per pair (proxy, full)."""
    keys = ["run_id", "step", "prompt_id", "cand_idx"] + (["reward_name"] if "reward_name" in candidates else [])
    explore = candidates[candidates["precision"] == "explore"]
    full = candidates[candidates["precision"] == "full"]
    pairs = explore[keys + ["reward", "noise_seed"]].rename(columns={"reward": "proxy"}).merge(
        full[keys + ["reward"]].rename(columns={"reward": "full"}), on=keys, how="inner")
    n_explore = explore.groupby(keys[:3] + keys[4:]).size().rename("n_explore")
    pairs = pairs.merge(n_explore, left_on=keys[:3] + keys[4:], right_index=True, how="left")
    return pairs


def group_fidelity(pairs: pd.DataFrame, ks: tuple[int, ...]) -> pd.DataFrame:
    """One row per prompt group: n, kind, tau, rho, hit@K, overlap@K (or side agreement)."""
    group_keys = ["run_id", "step", "prompt_id"] + (["reward_name"] if "reward_name" in pairs else [])
    rows = []
    for key, g in pairs.groupby(group_keys, sort=True):
        n = len(g)
        if n < MIN_PAIRS:
            continue
        g = g.sort_values("cand_idx")
        proxy, full = g["proxy"].to_numpy(float), g["full"].to_numpy(float)
        complete = int(g["n_explore"].iloc[0]) == n
        row = dict(zip(group_keys, key if isinstance(key, tuple) else (key,)))
        row.update(n_pairs=n, n_explore=int(g["n_explore"].iloc[0]), kind="all seeds" if complete else "selected only")
        constant = np.ptp(proxy) == 0 or np.ptp(full) == 0
        row["kendall_tau"] = math.nan if constant else float(stats.kendalltau(proxy, full).statistic)
        row["spearman_rho"] = math.nan if constant else float(stats.spearmanr(proxy, full).statistic)
        for k in ks:
            row[f"hit@{k}"] = len(top_k(proxy, k) & top_k(full, k)) / k if k < n else math.nan
            if complete:
                row[f"overlap@{k}"] = len(best_worst(proxy, k) & best_worst(full, k)) / k if k <= n else math.nan
        if not complete:
            half = n // 2
            same = (np.isin(np.arange(n), list(top_k(proxy, half))) == np.isin(np.arange(n), list(top_k(full, half))))
            row["side_agreement"] = float(same.mean())
        rows.append(row)
    return pd.DataFrame(rows)


@report_kind("ranking_fidelity", title="Ranking fidelity (Table 8)", order=50)
def ranking_fidelity(tables: Tables):
    """Kendall tau, Spearman rho, top-K hit rates and contrastive overlap of proxy vs full rewards."""
    runs = pd.concat([tables.done_runs, tables.fidelity_runs])
    cand = tables.candidates[tables.candidates["run_id"].isin(runs["run_id"])]
    if cand.empty:
        return Note("Ranking fidelity", "No candidates table rows of done runs: no method recorded per-candidate rewards.")
    pairs = pair_candidates(cand)
    if pairs.empty:
        return Note("Ranking fidelity", "No candidate was scored at both precisions (explore and full): ranking "
                    "fidelity needs Sol-RL training candidates or a fidelity experiment.")
    ks = tuple(tables.options.top_k)
    groups = group_fidelity(pairs, ks)
    if groups.empty:
        return Note("Ranking fidelity", f"No prompt group has {MIN_PAIRS} or more candidates at both precisions.")
    groups = groups.merge(runs[["run_id", "model", "arm", "status"]], on="run_id", how="left")
    level = tables.options.ci_level
    by = ["kind", "model", "arm"] + (["reward_name"] if "reward_name" in groups else [])
    summary, display = [], []
    metric_cols = ["kendall_tau", "spearman_rho"] + [f"hit@{k}" for k in ks] + \
        [c for c in [f"overlap@{k}" for k in ks] + ["side_agreement"] if c in groups]
    explore_of = _arm_explore(runs)
    for key, g in groups.groupby(by, sort=False):
        row = dict(zip(by, key))
        row.update(n_groups=len(g), n_pairs_median=float(g["n_pairs"].median()),
                   constant_groups=int(g["kendall_tau"].isna().sum()), explore=explore_of.get(row["arm"], ""))
        disp = {k if k != "arm" else "method": v for k, v in zip(by, key)}
        disp["explore (format, recipe, backend)"] = explore_of.get(row["arm"], "-")
        disp["groups"] = str(len(g))
        disp["pairs / group"] = f"{g['n_pairs'].median():g}"
        for col in metric_cols:
            ci = mean_ci(g[col].values, level) if col in g else mean_ci([], level)
            row.update({f"{col}_mean": ci.mean, f"{col}_lo": ci.lo, f"{col}_hi": ci.hi,
                        f"{col}_median": float(g[col].median()) if col in g else math.nan})
            disp[col.replace("kendall_tau", "Kendall τ").replace("spearman_rho", "Spearman ρ")] = fmt_ci(ci, 3)
            if col.startswith("hit@") and g["n_pairs"].median() > 0:  # a random ranking's hit rate: K / N
                row[f"{col}_chance"] = chance = int(col[4:]) / float(g["n_pairs"].median())
                disp[col] += f" (chance {chance:.2f})"
        summary.append(row)
        display.append(disp)
    summary_df = pd.DataFrame(summary).sort_values("kind")
    display_df = pd.DataFrame(display).loc[summary_df.index]
    has_selected = (groups["kind"] == "selected only").any()
    caption = (
        "Mirrors the paper's Table 8 (NVFP4 vs BF16 rewards of the same seeds: Kendall τ 0.798, Spearman ρ 0.927, "
        "top-K hit rate 96.9 / 95.0 / 93.3 % at K = 4 / 8 / 12). One unit = one prompt group (one prompt at one "
        "iteration of one run, or one prompt of a fidelity run); cells: mean over groups ± half-width of the "
        f"{level:.0%} t interval. hit@K: share "
        "of the proxy's top K that are in the full-precision top K, beside its chance level K/N (what a random "
        "ranking of the N seeds scores: at the paper's N = 96, 0.04 / 0.08 / 0.125). overlap@K: share of the contrastive set "
        "(top K/2 + bottom K/2) chosen from proxy rewards that full precision would also choose. "
        "'all seeds': both precisions for every candidate (unbiased). The explore column names the format, recipe "
        "and backend of each arm's low-precision copy (an emulated backend fake-quantizes in full precision). "
        + ("'selected only': Sol-RL training data, where only the K selected seeds have full-precision rewards: "
           "correlations and hit rates are within the K selected, which best_worst selection takes from both "
           "tails of the proxy ranking, so they are inflated relative to the all-seeds numbers; side_agreement: "
           "share of the K that full precision puts on the same side (top K/2 vs bottom) as the proxy. " if has_selected else "")
        + "Groups with constant rewards have no correlation and are left out of τ and ρ (counted in the CSV)."
    )
    outputs = [Table("ranking_fidelity", "Ranking fidelity: proxy (explore) vs full-precision rewards", summary_df,
                     caption, display=display_df),
               _fidelity_figure(groups, ks, explore_of, _trained(tables), arm_labels(tables, set(groups["arm"])))]
    setup = _fidelity_setup(runs[runs["run_id"].isin(groups["run_id"])])
    if setup is not None:
        outputs.insert(0, setup)
        decomposed = decomposed_fidelity(tables, groups, runs)
        if decomposed is not None:
            outputs.insert(2, decomposed)
    outputs.append(Table("ranking_fidelity_groups", "Ranking fidelity per prompt group", groups,
                         "Every prompt group's numbers (the distributions above).",
                         display=_groups_preview(groups)))
    return outputs


def _arm_explore(runs: pd.DataFrame) -> dict[str, str]:
    """{arm: its explore format, recipe and backend in words} (solbench.report.explore)."""
    from solbench.report.explore import explore_text

    return {arm: explore_text(group) for arm, group in runs.groupby("arm", sort=False)}


def _trained(tables: Tables) -> set[str]:
    from solbench.report.findings_common import trained_rewards

    return trained_rewards(tables, tables.done_runs)


# p_* columns of a `solbench fidelity` run (solbench/fidelity/experiment.py) -> setup table column
_SETUP = {"p_checkpoint.path": "checkpoint", "p_checkpoint.step": "step", "p_checkpoint.role": "role",
          "p_prompts.set": "prompts", "p_prompts.n_prompts": "M prompts", "p_seeds": "N seeds",
          "p_sampling.sampler": "sampler", "p_sampling.explore_steps": "explore steps", "p_sampling.steps": "full steps",
          "p_quant.recipe": "explore recipe", "p_quant.backend": "backend"}


def _fidelity_setup(runs: pd.DataFrame) -> Table | None:
    """What each standalone fidelity run sampled (runs written by `solbench fidelity`)."""
    if "p_kind" not in runs:
        return None
    runs = runs[runs["p_kind"] == "fidelity"]
    if runs.empty:
        return None
    cols = ["run_id", "arm", "model"] + [c for c in _SETUP if c in runs]
    data = runs[cols].rename(columns={"arm": "method", **_SETUP}).reset_index(drop=True)
    if "checkpoint" in data:
        data["checkpoint"] = data["checkpoint"].astype(object).fillna("base model")
    else:
        data["checkpoint"] = "base model"
    if {"explore recipe", "backend"} <= set(data.columns):  # a full-precision control has no low-precision backend
        data["backend"] = data["backend"].where(data["explore recipe"].astype(str) != "none", "- (full precision)")
    display = data.copy()
    for col in display.columns:
        display[col] = display[col].map(lambda v: "-" if v is None or (isinstance(v, float) and math.isnan(v))
                                        else f"{v:g}" if isinstance(v, float) else str(v))
    return Table("ranking_fidelity_setup", "Fidelity experiment: what was sampled", data, (
        "Standalone fidelity runs (`solbench fidelity`): one fixed checkpoint, no training; every one of the N seeds "
        "of each prompt sampled by the explore copy (the recipe, explore steps) and by the full-precision network "
        "(full steps) from the same initial noise, so every prompt group below is an 'all seeds' group. Recipe "
        "'none' explores in full precision: the step-count effect alone."), display=display)


def _groups_preview(groups: pd.DataFrame) -> pd.DataFrame:
    """A short distribution summary per arm (checkpoint and recipe), reward and kind, never pooled across them;
    the full per-group table is the CSV."""
    cols = [c for c in groups.columns if c in ("kendall_tau", "spearman_rho") or c.startswith(("hit@", "overlap@"))]
    by = ["arm", "kind"] + (["reward_name"] if "reward_name" in groups else [])
    rows = []
    for key, g in groups.groupby(by, sort=False, dropna=False):
        labels = dict(zip(by, key))
        for col in cols:
            v = g[col].dropna()
            if v.empty:
                continue
            q = v.quantile([0.1, 0.5, 0.9])
            rows.append({"method": labels["arm"], "kind": labels["kind"],
                         "reward": _reward_name(labels.get("reward_name")), "statistic": col,
                         "groups": str(len(v)), "p10": f"{q[0.1]:.3f}", "median": f"{q[0.5]:.3f}",
                         "p90": f"{q[0.9]:.3f}", "min": f"{v.min():.3f}"})
    return pd.DataFrame(rows)


def _reward_name(name) -> str:
    """A fidelity group's reward: its name, or the training reward where the candidates name none."""
    return "training reward (total)" if name is None or (isinstance(name, float) and math.isnan(name)) else str(name)


def plotted_reward(groups: pd.DataFrame, trained: set[str] = frozenset()) -> str | None:
    """The one reward a fidelity figure ranks by: a training reward, else the first named one; None where the
    groups name none (training candidates, ranked by the training reward)."""
    if "reward_name" not in groups or groups["reward_name"].isna().all():
        return None
    names = list(dict.fromkeys(groups["reward_name"].dropna()))
    for name in names:
        if name in trained:
            return name
    return next((n for n in names if n != "total"), names[0])


def _fidelity_figure(groups: pd.DataFrame, ks: tuple[int, ...], recipes: dict[str, str],
                     trained: set[str] = frozenset(), labels: dict[str, str] | None = None) -> Figure:
    """One distribution per arm (checkpoint, recipe) and kind, never pooled across them, one row each, the row named
    on the axis (its short arm label, its explore format, recipe and backend, the kind); the mean hit@K of each row
    beside its chance level K/N on the same rows. The title names the reward."""
    from solbench.report.plotting import _FALLBACK, NORMAL, SMALL, TITLE, clip, legend_below, style_axes

    labels = labels or {}
    reward = plotted_reward(groups, trained)
    if reward is not None:  # one reward: the training reward's groups, and those that name none (training data)
        groups = groups[groups["reward_name"].isna() | (groups["reward_name"] == reward)]
    reward_text = f"reward `{reward}`" if reward is not None else "the training reward"
    if reward is not None and groups["reward_name"].isna().any():
        reward_text += " (training candidates: their training reward)"
    series = [(kind, arm) for kind in sorted(groups["kind"].unique()) for arm in sorted(set(groups["arm"]))
              if ((groups["kind"] == kind) & (groups["arm"] == arm)).any()]
    # colour: the explore copy (format, recipe, backend), in colours no method has (the rows are named on the axis)
    copies = list(dict.fromkeys(recipes.get(arm, "") for _, arm in series))
    colours = {key: _FALLBACK[copies.index(recipes.get(key[1], "")) % len(_FALLBACK)] for key in series}
    plain = clip(reward_text.replace("`", ""), 80)  # a PNG shows Markdown backticks as they are (issue 48)
    hit_cols = [f"hit@{k}" for k in ks if f"hit@{k}" in groups and groups[f"hit@{k}"].notna().any()]
    # at least the height the y label needs (2.9 in at 9 pt): with two rows it was clipped at the top and bottom
    fig = new_figure(13.0 if hit_cols else 10.0, max(3.4, 1.8 + 0.46 * len(series)))
    axes = fig.subplots(1, 3 if hit_cols else 2, sharey=True, width_ratios=[1, 1, 0.8] if hit_cols else [1, 1])
    # one box per arm and kind (issue 48: eleven overlaid histogram outlines on a -1..1 axis could not be told
    # apart), on an axis fitted to the data; each row named on the axis (issue 52: an 11-entry legend)
    rows = [len(series) - i for i in range(len(series))]
    low = 1.0
    for ax, col, label in ((axes[0], "kendall_tau", "Kendall τ"), (axes[1], "spearman_rho", "Spearman ρ")):
        values = [groups.loc[(groups["kind"] == key[0]) & (groups["arm"] == key[1]), col].dropna() for key in series]
        kept = [(i, v) for i, v in enumerate(values) if len(v)]
        if kept:
            box = ax.boxplot([v.to_numpy() for _, v in kept], positions=[rows[i] for i, _ in kept],
                             orientation="horizontal", widths=0.6, patch_artist=True, showfliers=True,
                             flierprops=dict(markersize=2.5), medianprops=dict(color="black", linewidth=1.2))
            for patch, (i, _) in zip(box["boxes"], kept):
                patch.set_facecolor(colours[series[i]])
                patch.set_alpha(0.8)
            low = min(low, min(float(v.min()) for _, v in kept))
        style_axes(ax, f"{label} per prompt group (rank correlation)", "")
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(rows, [_row_label(key, recipes, labels, groups.loc[(groups["kind"] == key[0])
                                                                         & (groups["arm"] == key[1]), "spearman_rho"])
                              for key in series], fontsize=SMALL)
    axes[0].set_ylabel("arm (checkpoint, explore copy) and kind", fontsize=NORMAL)
    for ax in axes[:2]:
        ax.set_xlim(max(-1.0, low - 0.05), 1.0)
    if hit_cols:
        ax = axes[2]
        n = float(groups["n_pairs"].median())
        markers = ["o", "s", "^", "D", "v"]
        for j, c in enumerate(hit_cols):
            colour = ["#222222", "#6a6a6a", "#a0a0a0", "#4a4a4a", "#8a8a8a"][j % 5]
            means = [groups.loc[(groups["kind"] == key[0]) & (groups["arm"] == key[1]), c].mean() for key in series]
            ax.plot(means, rows, linestyle="none", marker=markers[j % len(markers)], color=colour, markersize=5,
                    label=f"{c} (mean)")
            ax.axvline(int(c.split("@")[1]) / n, color=colour, linestyle=":", linewidth=1.0,
                       label=f"{c} chance, {c.split('@')[1]}/N")
        ax.set_xlim(0, 1.05)
        style_axes(ax, f"mean top-K hit rate (share; N={n:g})", "")
        legend_below(fig, *ax.get_legend_handles_labels(), ncols=len(hit_cols))
    fig.suptitle(f"Ranking fidelity, {plain}: proxy (explore precision) vs full-precision rewards of the same "
                 "seeds", fontsize=TITLE)
    return Figure("ranking_fidelity_chart", "Ranking fidelity distributions", fig, (
        f"Distributions over prompt groups of the rank correlations between proxy and full-precision {reward_text}, "
        "one box per arm (checkpoint, explore recipe) and kind (median, quartiles, 1.5 IQR whiskers), never pooled "
        "across them, each row named on the axis by its arm's short label, explore format, recipe and backend, kind "
        "and mean ρ; and the mean top-K hit rates of the same rows beside their chance level K/N "
        "(a random ranking's, dotted). Every reward: the tables above and the CSV. 'selected only' groups (training "
        "data) are within the K selected seeds and biased upward; 'all seeds' groups are the unbiased measurement."),
        data=groups)


def _row_label(key: tuple[str, str], recipes: dict[str, str], labels: dict[str, str], values: pd.Series) -> str:
    """Two lines naming a row of the fidelity chart: the arm's short label, then its explore copy (format, recipe,
    backend, without the backend's explanation) with the kind, mean ρ and n. Each line at most LABEL_CHARS."""
    import re

    from solbench.report.plotting import clip

    kind, arm = key
    explore = re.sub(r" backend \([^)]*\)", " backend", recipes.get(arm, "explore recipe not recorded"))
    return (f"{clip(labels.get(arm, arm))}\n"
            f"{clip(f'{explore} | {kind}: mean ρ {values.mean():.3f}, n={len(values)}', 90)}")


# ---- decomposed fidelity: what precision costs apart from fewer steps ------------------------------


def fidelity_settings(runs: pd.DataFrame) -> pd.DataFrame:
    """run_id, recipe and the settings a step-budget control must share (checkpoint, prompts, seeds, steps)."""
    from solbench.report.tables import _checkpoint_label

    every = runs
    runs = runs[runs.get("p_kind", pd.Series(index=runs.index, dtype=object)).astype(str) == "fidelity"] \
        if "p_kind" in runs else runs.iloc[0:0]
    cols = {"p_quant.recipe": "recipe", "p_checkpoint.path": "checkpoint", "p_prompts.set": "prompts",
            "p_prompts.n_prompts": "n_prompts", "p_seeds": "seeds", "p_sampling.explore_steps": "explore_steps",
            "p_sampling.steps": "steps", "p_sampling.sampler": "sampler", "p_quant.backend": "backend"}
    out = pd.DataFrame({"run_id": runs["run_id"].values, "model": runs["model"].values})
    from solbench.report.tables import _fmt_setting, _hashable

    for col, name in cols.items():
        out[name] = runs[col].map(lambda v: _fmt_setting(_hashable(v))).values if col in runs else "-"
    out["checkpoint_label"] = [_checkpoint_label(run, every) for _, run in runs.iterrows()]
    # what the explore copy put in low precision, measured when the run built it (solbench.fidelity.experiment.record_mac_share);
    # NaN for runs stored before it was recorded. Not a setting the control shares: the control's is 0.
    for col, name in (("p_quant.mac_share", "mac_share"), ("p_quant.quantized_linears", "quantized_linears"),
                      ("p_quant.linears", "linears")):
        out[name] = pd.to_numeric(runs[col], errors="coerce").values if col in runs else np.nan
    return out


def _coverage(sub: pd.DataFrame) -> tuple[float, str]:
    """(share of the linear MACs in low precision, display cell) of one recipe's runs: '99.0 % (41 of 48 Linears)'."""
    share = sub["mac_share"].dropna().unique()
    if len(share) != 1:  # not recorded, or different copies under one recipe name: say nothing rather than guess
        return float("nan"), "-"
    q, n = sub["quantized_linears"].dropna().unique(), sub["linears"].dropna().unique()
    layers = f" ({int(q[0])} of {int(n[0])} Linears)" if len(q) == 1 and len(n) == 1 else ""
    return float(share[0]), f"{100 * share[0]:.1f} %{layers}"


def decomposed_fidelity(tables: Tables, groups: pd.DataFrame, runs: pd.DataFrame) -> Table | None:
    """Spearman/Kendall per explore recipe beside the step-budget-only control (recipe none), with the
    paired difference over the same prompts and seeds."""
    from solbench.report.stats import paired_ci

    settings = fidelity_settings(runs)
    if settings.empty:
        return None
    g = groups[groups["kind"] == "all seeds"].merge(settings, on=["run_id", "model"])
    if g.empty:
        return None
    share = ["model", "checkpoint", "prompts", "n_prompts", "seeds", "explore_steps", "steps", "sampler", "backend"]
    reward_col = ["reward_name"] if "reward_name" in g else []
    o = tables.options
    rows, display = [], []
    formats = recipe_formats(runs)  # each recipe's format as the runs recorded it
    backends = stored_backends(runs)  # each backend in words, as the runs recorded them
    for key, sub in g.groupby(share + reward_col, sort=False, dropna=False):
        ctx = dict(zip(share + reward_col, key))
        control = sub[sub["recipe"] == "none"]
        for recipe in sorted(sub["recipe"].unique(), key=lambda r: (r != "none", r)):
            r = sub[sub["recipe"] == recipe]
            mac_share, mac_cell = _coverage(r)
            row = {**ctx, "checkpoint_label": r["checkpoint_label"].iloc[0], "recipe": recipe,
                   "label": recipe_label(recipe, formats.get(recipe)), "prompt_groups": len(r), "mac_share": mac_share}
            disp = {"model": ctx["model"], "checkpoint": r["checkpoint_label"].iloc[0],
                    "reward": ctx.get("reward_name", "-"), "explore steps": ctx["explore_steps"],
                    "explore": recipe_label(recipe, formats.get(recipe)),
                    "backend": "- (full precision)" if recipe == "none" else backend_label(ctx.get("backend"), backends),
                    "low-precision share of linear MACs": mac_cell,
                    "prompts": str(len(r))}
            for col, name in (("spearman_rho", "Spearman ρ"), ("kendall_tau", "Kendall τ")):
                ci = mean_ci(r[col].values, o.ci_level)
                row.update({f"{col}_mean": ci.mean, f"{col}_lo": ci.lo, f"{col}_hi": ci.hi})
                disp[name] = fmt_ci(ci, 3)
                if recipe != "none" and not control.empty:
                    paired = r[["prompt_id", col]].merge(control[["prompt_id", col]], on="prompt_id", suffixes=("", "_c"))
                    d = (paired[col] - paired[f"{col}_c"]).dropna().to_numpy()
                    p = paired_ci(d[None, :], level=o.ci_level)  # one run: a t interval over its prompts
                    row.update({f"{col}_vs_steps_only": p.mean, f"{col}_vs_steps_only_lo": p.lo,
                                f"{col}_vs_steps_only_hi": p.hi})
                    disp[f"Δ{name[-1]} vs step budget only"] = (f"{p.mean:+.3f} [{p.lo:+.3f}, {p.hi:+.3f}]"
                                                                if np.isfinite(p.lo) else f"{p.mean:+.3f}")
                elif recipe == "none":
                    disp[f"Δ{name[-1]} vs step budget only"] = "0 (control)"
                else:
                    disp[f"Δ{name[-1]} vs step budget only"] = "- (no control run)"
            rows.append(row)
            display.append(disp)
    if not rows:
        return None
    return Table("ranking_fidelity_decomposed", "Decomposed fidelity: fewer steps vs lower precision",
                 pd.DataFrame(rows), (
                     "All-seeds fidelity runs of the same checkpoint, prompts, seeds and step budgets, one row per "
                     "explore recipe. 'step budget only (full precision)': the explore steps run by the full-precision "
                     "network (recipe none), so its ρ and τ are what fewer steps alone cost; the other rows add the "
                     "precision (NVFP4, MXFP4, FP8). Low-precision share: of the transformer's linear multiply-"
                     "accumulates, the part the explore copy ran in the recipe's format (one forward, measured when the "
                     "run built the copy; '-' where the run did not record it). Cells: mean over prompt groups ± "
                     f"{o.ci_level:.0%} t half-width. Δ vs step budget only: paired per prompt (same prompts and seeds), "
                     f"[{o.ci_level:.0%} t interval over prompts]: what the precision "
                     "costs apart from fewer steps."), display=pd.DataFrame(display))
