"""What the trainer stores at evaluation time for the report's honesty checks: objects beyond what the prompt asks
(reward hacking the shapes rewards cannot see), sample grids with every prompt skill, and the machine's load on
every timing row."""

from __future__ import annotations

import dataclasses

import pytest

from solbench.world import detector, scenes
from solbench.world.scenes import ObjectSpec, SceneSpec


def _image(*objects):
    return scenes.render_batch([SceneSpec(tuple(objects), 0.05)])


def test_extra_objects_counts_what_the_prompt_did_not_ask_for_and_the_rewards_do_not_penalise():
    """Bug caught (issue 25, naive FP4's step-90 samples): 'a green circle' drawn as four green circles scores a
    perfect 1.0 on both shapes rewards ("at least" one), so only a separate count can show it."""
    circles = [ObjectSpec("circle", "green", 9, x, y) for x, y in ((7, 7), (24, 7), (7, 24), (24, 24))]
    four = _image(*circles)
    one = _image(circles[0])
    assert float(detector.score_images(four, ["a green circle"], strict=True)[0]) == 1.0
    assert float(detector.score_images(four, ["a green circle"], strict=False)[0]) > 0.95
    got = detector.extra_objects(four.repeat(3, 1, 1, 1), ["a green circle", "four green circles", "two green circles"])
    assert got.tolist() == [3.0, 0.0, 2.0]
    assert detector.extra_objects(one, ["a green circle"]).tolist() == [0.0]
    red_square = ObjectSpec("square", "red", 9, 24, 16)
    assert detector.extra_objects(_image(circles[0], red_square), ["a green circle left of a red square"]).tolist() == [0.0]
    assert detector.extra_objects(_image(circles[0], red_square), ["a red square"]).tolist() == [1.0]


def test_grid_prompts_take_every_skill_in_turn():
    """Bug caught: the grid showed the first 8 eval prompts, which are single-object and counting prompts only."""
    from solbench.train.trainer import grid_prompt_indices

    skills = ["single"] * 3 + ["counting"] * 9 + ["color_attr"] * 9 + ["position"] * 12
    picked = grid_prompt_indices(skills, 8)
    assert picked == [0, 1, 3, 4, 12, 13, 21, 22]
    assert {skills[i] for i in picked} == {"single", "counting", "color_attr", "position"}
    assert grid_prompt_indices([None] * 5, 3) == [0, 1, 2]  # .txt prompt sets: the first prompts


def test_evaluation_stores_extra_objects_per_sample_and_timings_carry_the_load(tmp_path):
    """A two-iteration run on the shapes rewards: every evaluation writes one eval_check row per eval sample (its
    prompt, eval seed and skill, the detector's count), and every timing row its load."""
    from _tiny_config import small_config

    from solbench.results import RunStore
    from solbench.train.trainer import train_run

    cfg = small_config("diffusion_nft", experiment="checks", planned_iterations=1, seed=0)
    cfg.rewards = {"shapes_geneval": 1.0}
    cfg.eval = dataclasses.replace(cfg.eval, prompts="shapes/eval", n_prompts=4, seeds_per_prompt=2,
                                   rewards=["shapes_geneval", "shapes_geneval_strict"], grid_prompts=4)
    store = RunStore(tmp_path / cfg.run_id, cfg.run_id)
    train_run(cfg, store)
    rows = store.read("metrics")
    checks = [r for r in rows if r["split"] == "eval_check"]
    assert {r["metric"] for r in checks} == {"extra_objects"}  # once per sample, not once per reward
    assert len(checks) == 2 * 4 * 2  # evaluations at steps 0 and 1, 4 prompts x 2 eval seeds
    assert all(r["value"] >= 0 and float(r["value"]).is_integer() for r in checks)
    assert {(r["prompt_id"], r["eval_seed"]) for r in checks if r["step"] == 0} == {
        (f"eval-{i:04d}", s) for i in range(4) for s in range(2)}
    assert {r["skill"] for r in checks} == {"single_object", "counting"}
    assert not any(r["split"] == "eval" and r["metric"] == "extra_objects" for r in rows)  # never an eval "reward"
    timings = store.read("timings")
    assert timings and all("load" in r for r in timings)
    assert all(r["load"] is None or r["load"] >= 0 for r in timings)


def test_the_load_is_other_programs_busy_time_on_this_process_cores(monkeypatch):
    """The arithmetic of PhaseTimer's load: (busy seconds of the process's cores - its own CPU seconds) / wall
    seconds, from the kernel's counters (here replaced by known values)."""
    import solbench.engine.timing as timing

    clock = iter([10.0, 12.0])  # perf_counter at the start and the end: a 2 s span
    busy = iter([100.0, 104.5])  # the cores were busy 4.5 s in it
    own = iter([1.0, 2.5])  # of which this process 1.5 s
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(timing.time, "process_time", lambda: next(own))
    monkeypatch.setattr(timing, "_busy_seconds", lambda cores: next(busy))
    timer = timing.PhaseTimer()
    with timer.phase("train", precision="full"):
        pass
    (record,) = timer.drain()
    assert record.seconds == pytest.approx(2.0) and record.load == pytest.approx((4.5 - 1.5) / 2.0)
    assert "load" in record.row()
