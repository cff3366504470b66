"""The read-out horizon declared before the data, and the readings taken past reward hacking (issue 54).

A spec names the iteration its primary claims are read at (``report.readout_iteration``) and says beside it how it
was chosen (``report.readout_note``: a pilot on other seeds, a previous report; refused without it), so that the
iteration is not picked on the data it judges. Every paired reading of a Findings row is then checked against the
arms' curves: a reading at step s of an arm is **past reward hacking** when, at some evaluation t <= s, one of its
held-out rewards (an eval reward the runs did not train on) had fallen more than ``report.hacking_drop`` (a fraction
of its peak) below its peak over the evaluations up to t while the training reward at t was no lower than at that
peak: the policy still gains on what it is trained on and loses on what it is not. Curves are the arm's mean over
its run seeds (``eval`` rows); from the first such t on, every later reading of that arm is flagged
(``Finding.readout_flag``, findings.csv ``readout_flag``), and the reward-hacking section lists the arms and where.
Reads stored results only.
"""

from __future__ import annotations

import math

import pandas as pd

from solbench.report.tables import Tables


def readout_step(tables: Tables) -> int | None:
    """The declared read-out iteration, or None (each claim at its last common evaluation)."""
    return tables.options.readout_iteration


def _roles(tables: Tables) -> tuple[list[str], list[str]]:
    from solbench.report.findings_common import HELD_OUT, TRAINING, reward_roles

    roles = reward_roles(tables, tables.done_runs)
    return [r for r, role in roles if role == TRAINING], [r for r, role in roles if role == HELD_OUT]


def hacking_points(tables: Tables) -> pd.DataFrame:
    """One row per (model, arm) whose curves pass the rule of the module docstring: model, arm, step (the first
    evaluation past it), reward (the held-out reward that fell), peak_step, peak, value, drop (fraction of the peak)
    and training_then / training_at_peak. Cached per Tables and options."""
    key = (tables.options.hacking_drop, len(tables.metrics), len(tables.done_runs))
    cache = tables.__dict__.setdefault("_hacking_points", {})
    if key not in cache:
        cache[key] = _hacking_points(tables)
    return cache[key]


def _curve(tables: Tables, metric: str) -> pd.DataFrame:
    m = tables.run_metrics("eval", metric)
    return m.groupby(["model", "arm", "step"])["value"].mean().reset_index()


def _hacking_points(tables: Tables) -> pd.DataFrame:
    cols = ["model", "arm", "step", "reward", "peak_step", "peak", "value", "drop", "training_then", "training_at_peak"]
    trained, held = _roles(tables)
    if not trained or not held:
        return pd.DataFrame(columns=cols)
    train = _curve(tables, trained[0]).set_index(["model", "arm", "step"])["value"]
    limit = float(tables.options.hacking_drop)
    found: dict[tuple, dict] = {}
    for reward in held:
        for (model, arm), g in _curve(tables, reward).groupby(["model", "arm"]):
            g = g.sort_values("step")
            peak, peak_step = -math.inf, None
            for step, value in zip(g["step"].astype(int), g["value"].astype(float)):
                if value > peak:
                    peak, peak_step = value, step
                    continue
                drop = (peak - value) / abs(peak) if peak else math.inf
                t_now, t_peak = train.get((model, arm, step), math.nan), train.get((model, arm, peak_step), math.nan)
                if drop > limit and not (t_now < t_peak):  # the training reward held (or was not recorded)
                    old = found.get((model, arm))
                    if old is None or step < old["step"]:
                        found[(model, arm)] = dict(model=model, arm=arm, step=step, reward=reward, peak_step=peak_step,
                                                   peak=peak, value=value, drop=drop, training_then=t_now,
                                                   training_at_peak=t_peak)
                    break
    return pd.DataFrame(list(found.values()), columns=cols)


def flag_text(tables: Tables, model: str, arms, step) -> str:
    """'' or why a reading of ``arms`` at ``step`` is past reward hacking (the first flagged arm of them)."""
    if step is None or (isinstance(step, float) and math.isnan(step)):
        return ""
    points = hacking_points(tables)
    for arm in dict.fromkeys(a for a in arms if a):
        hit = points[(points["model"] == model) & (points["arm"] == arm)]
        if len(hit) and int(step) >= int(hit["step"].iloc[0]):
            h = hit.iloc[0]
            return (f"read at step {int(step)}, past reward hacking of {arm}: from step {int(h['step'])} its held-out "
                    f"`{h['reward']}` is {h['drop']:.0%} below its peak ({h['peak']:.4f} at step {int(h['peak_step'])}, "
                    f"{h['value']:.4f} at {int(h['step'])}) while the training reward held (drop declared: "
                    f"report.hacking_drop {tables.options.hacking_drop:.0%})")
    return ""


def hacked_arms_table(tables: Tables):
    """The reward-hacking section's list of the arms past the point, and where (a Table), or a Note when none."""
    from solbench.report.registry import Note, Table

    points = hacking_points(tables)
    drop = tables.options.hacking_drop
    it = readout_step(tables)
    readout = (f" The primaries are read at iteration {it} (report.readout_iteration: {tables.options.readout_note})."
               if it is not None else " No read-out iteration is declared (report.readout_iteration): each claim is "
               "read at its last common evaluation.")
    if points.empty:
        return Note("Arms past reward hacking", f"No arm's held-out reward fell more than {drop:.0%} below its peak "
                    f"while its training reward held.{readout}")
    display = pd.DataFrame({
        "arm": points["arm"], "past it from step": points["step"].astype(int).astype(str),
        "held-out reward": "`" + points["reward"] + "`",
        "fall from the peak": [f"{p:.4f} (step {int(s)}) -> {v:.4f}: -{d:.0%}" for p, s, v, d in
                               zip(points["peak"], points["peak_step"], points["value"], points["drop"])],
        "training reward then vs at the peak": [f"{a:.4f} vs {b:.4f}" for a, b in
                                                zip(points["training_then"], points["training_at_peak"])]})
    if it is not None:
        display["read-out iteration past it?"] = ["**yes**" if it >= s else "no" for s in points["step"]]
    return Table("reward_hacking_readout", "Arms past reward hacking (readings flagged in Findings)", points, (
        f"An arm is past reward hacking from the first evaluation at which a held-out reward (one the runs did not "
        f"train on) is more than {drop:.0%} (report.hacking_drop, declared before the data) below its peak so far "
        "while the training reward is no lower than at that peak (curves: the arm's mean over run seeds). Every "
        "Findings reading of such an arm at or after that step carries the flag (findings.csv `readout_flag`)."
        + readout), display=display)
