"""The live progress of runs (solbench/train/progress.py): what progress.json holds and the lines the board logs."""

from __future__ import annotations

import io
import json

from solbench.train.progress import Board, LiveDisplay, ProgressWriter, RunLine


def test_the_final_line_shows_the_final_iterations_reward(tmp_path):
    # Bug caught: `running -> done iter 4/4 reward 0.3207` showed iteration 3's reward: the evaluation after
    # iteration 4 rewrote progress.json without a training reward, and the board kept the last one it had seen.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    writer = ProgressWriter(run_dir, iterations=4, min_interval_s=0.0)
    state = {"run": ("running", {})}
    board = Board("t", [RunLine("run", "sol_rl", "n=4")], lambda: state, {"run": run_dir})
    stream = io.StringIO()
    with LiveDisplay(board, stream=stream) as display:
        writer("run", 3, "train", {"reward": 0.3207, "loss": 0.1})
        display.tick(force=True)
        writer("run", 4, "train", {"reward": 0.4125, "loss": 0.2})
        writer("run", 4, "eval", {"shapes_geneval": 0.55, "shapes_geneval/counting": 0.5})
        state["run"] = ("done", {})
    lines = stream.getvalue().splitlines()
    assert "[run sol_rl n=4] train iter 3/4 reward 0.3207" in lines
    assert "[run sol_rl n=4] running -> done iter 4/4 reward 0.4125" in lines, lines

    # the step's record keeps what each call of the step said, and a new step starts afresh
    record = json.loads((run_dir / "progress.json").read_text())
    assert record["step"] == 4 and record["phase"] == "eval"
    assert record["info"] == {"reward": 0.4125, "loss": 0.2, "shapes_geneval": 0.55, "shapes_geneval/counting": 0.5}
    writer("run", 5, "eval", {"shapes_geneval": 0.6})
    assert json.loads((run_dir / "progress.json").read_text())["info"] == {"shapes_geneval": 0.6}
