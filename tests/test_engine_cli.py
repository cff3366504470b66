"""`solbench sample` and `solbench eval` end to end on the tiny model (untrained weights: fast)."""

import json

import numpy as np
import pytest
from PIL import Image

from solbench.cli import main
from solbench.commands.sample import image_grid, parse_seeds
from solbench.errors import ConfigError

TINY = ["--model", "tiny", "--model-path", "random", "--device", "cpu"]


def test_sample_writes_a_deterministic_grid(tmp_path, capsys):
    out = tmp_path / "grid.png"
    args = ["sample", *TINY, "--prompts", "three red circles", "a blue square", "--seeds", "0-2",
            "--steps", "2", "--scale", "1", "--out", str(out)]
    assert main(args) == 0
    assert "2 prompts x 3 seeds" in capsys.readouterr().out
    grid = np.asarray(Image.open(out))
    assert grid.shape == (2 * 34 + 2, 3 * 34 + 2, 3)  # 32 px images with 2 px padding
    cells = [grid[2 + r * 34: 34 + r * 34, 2 + c * 34: 34 + c * 34] for r in range(2) for c in range(3)]
    assert all(cell.std() > 0 for cell in cells)
    assert not np.array_equal(cells[0], cells[1])  # different seeds, different images
    again = tmp_path / "again.png"
    assert main([*args[:-1], str(again)]) == 0
    assert np.array_equal(np.asarray(Image.open(again)), grid)


def test_eval_prints_a_table_per_skill_and_writes_json(tmp_path, capsys):
    out = tmp_path / "eval.json"
    args = ["eval", *TINY, "--prompt-set", "shapes/heldout", "--n-prompts", "5", "--seeds", "2", "--steps", "2",
            "--rewards", "shapes_geneval_strict,shapes_geneval", "--batch", "4", "--json", str(out)]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "shapes_geneval_strict" in text and "overall" in text
    table = json.loads(out.read_text())["table"]
    skills = [s for s in table if s != "overall"]
    assert skills and all(s in text for s in skills)
    assert table["overall"]["n"] == 10 == sum(table[s]["n"] for s in skills)
    for name in ("shapes_geneval_strict", "shapes_geneval"):
        weighted = sum(table[s][name] * table[s]["n"] for s in skills) / 10
        assert table["overall"][name] == pytest.approx(weighted, abs=1e-6)
        assert 0 <= table["overall"][name] <= 1


def test_cli_errors_are_reported_without_traceback(capsys):
    assert main(["sample", *TINY, "--prompts", "x", "--seeds", "7-3"]) == 2
    assert "--seeds" in capsys.readouterr().err
    assert main(["eval", "--model", "tinny", "--seeds", "1"]) == 2
    assert "did you mean tiny" in capsys.readouterr().err


def test_seed_parsing_and_grid_layout():
    assert parse_seeds("0-3,7") == [0, 1, 2, 3, 7] and parse_seeds("5") == [5]
    with pytest.raises(ConfigError):
        parse_seeds("a-b")
    import torch

    imgs = torch.stack([torch.full((3, 2, 2), v) for v in (0.0, 0.5, 1.0, 0.25)])
    grid = image_grid(imgs, 2, 2, scale=2, pad=1)
    assert grid.shape == (2 * 5 + 1, 2 * 5 + 1, 3) and grid.dtype == torch.uint8
    assert grid[1, 1, 0] == 0 and grid[1, 6, 0] == 128 and grid[6, 1, 0] == 255 and grid[6, 6, 0] == 64
