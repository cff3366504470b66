"""A spec written by an attacker or a careless hand cannot exhaust the machine: a YAML alias bomb, a file of any
size, a matrix of 100,000 runs, an empty --only prefix and prompts outside the world's grammar are each one line
naming the bound (or the problem) and the spec line, before anything runs; and expand still plans a spec whose
prompt files are not downloaded yet.

The command lines run in a subprocess under an address-space limit (tests/_bounded_cli.py, 2 GiB), so a
regression fails its case (MemoryError) instead of taking the machine, and each case's peak memory is asserted
below 1 GiB; the subprocess has a wall-clock timeout as a safety net only (no test here is timed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from solbench.cli import main as cli
from solbench.spec import load_spec

from _bounded_cli import REPO, bounded, one_line

SMOKE = REPO / "experiments" / "smoke.yaml"


def billion_laughs(path: Path) -> Path:
    """Nine levels of ten aliases under `description` (10**9 strings once expanded): the fifth level, on line 6,
    is the first to name more than 100,000 nodes."""
    lines = ["name: laughs", 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for previous, level in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{level}: &{level} [" + ", ".join([f"*{previous}"] * 10) + "]")
    lines += ["description: *i", "matrix:", "  method: [sol_rl]"]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_yaml_alias_bomb_is_refused_by_expand_and_run_at_the_line_it_crosses_the_bound(tmp_path):
    """Bug caught: nine levels of ten aliases in `description` made expand and run each spend 45 s reaching
    6.5 GB and die in a MemoryError traceback (yaml_lines._index_lines walked every alias again); the loader now
    counts nodes with aliases expanded as it builds them."""
    spec = billion_laughs(tmp_path / "laughs.yaml")
    answers = bounded(tmp_path, ["expand", str(spec)], ["run", str(spec), "--results", str(tmp_path / "r")],
                      ["status", str(spec), "--results", str(tmp_path / "r")])
    for answer, command in zip(answers, ("expand", "run", "status")):
        line = one_line(answer, command)
        assert f"{spec}:6: more than 100,000 YAML nodes with its aliases expanded" in line, line
    assert not (tmp_path / "r").exists()


def test_recursive_aliases_deep_nesting_and_oversized_files_are_one_line_each(tmp_path):
    """Bug caught: an alias inside the node it names (`&a [*a]`), 5,000 nested lists and a spec file of any size
    (even /dev/zero, read to the end) reached a RecursionError or MemoryError traceback, or hung."""
    recursive = tmp_path / "recursive.yaml"
    recursive.write_text("name: r\nmatrix:\n  method: [sol_rl]\nbase: &a\n  x: [*a]\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: d\nmatrix:\n  method: [sol_rl]\nbase: " + "[" * 5000 + "]" * 5000 + "\n")
    big = tmp_path / "big.yaml"
    big.write_text("name: big\nmatrix:\n  method: [sol_rl]\n" + "# padding\n" * 20_000)
    answers = bounded(tmp_path, ["expand", str(recursive)], ["expand", str(deep)], ["expand", str(big)],
                      ["expand", "/dev/zero"])
    assert f"{recursive}:5: alias *a is inside the node &a names" in one_line(answers[0], "expand")
    assert f"{deep}:4: nested more than 64 levels deep" in one_line(answers[1], "expand")
    assert f"{big}: more than 128 KiB, the bound on a spec file's size" in one_line(answers[2], "expand")
    assert "/dev/zero: more than 128 KiB" in one_line(answers[3], "expand")


def test_a_matrix_past_the_run_bound_is_refused_before_expanding_and_max_runs_lifts_the_bound(tmp_path):
    """Bug caught: a matrix of 100,000 runs had no bound: expand took 157 s and 1.1 GB, status printed nothing
    for 180 s and run wrote nothing for 240 s. The combinations are counted before any is formed."""
    spec = tmp_path / "huge.yaml"
    seeds = ", ".join(str(s) for s in range(1000))
    rates = ", ".join(f"{(i + 1) * 1e-5:.5f}" for i in range(100))
    spec.write_text(f"name: huge\nbase:\n  model: {{name: tiny}}\nmatrix:\n  method: [diffusion_nft]\n"
                    f"  seed: [{seeds}]\n  finetune.lr: [{rates}]\n")
    small = tmp_path / "small.yaml"
    small.write_text(SMOKE.read_text())
    results = str(tmp_path / "r")
    answers = bounded(tmp_path, ["expand", str(spec)], ["run", str(spec), "--results", results],
                      ["status", str(spec), "--results", results],
                      ["expand", str(small), "--max-runs", "1"], ["expand", str(small), "--max-runs", "2", "--format",
                                                                   "ids"])
    for answer, command in zip(answers, ("expand", "run", "status")):
        line = one_line(answer, command)
        assert (f"{spec}:5: matrix: forms 100,000 combinations (method 1 x seed 1,000 x finetune.lr 100 values), "
                "past the bound of 10,000 runs") in line and "`--max-runs 100000`" in line, line
    assert "forms 2 combinations" in one_line(answers[3], "expand")
    assert answers[4]["rc"] == 0 and len(answers[4]["stdout"].split()) == 2, answers[4]
    assert not Path(results).exists()


def test_an_expansion_that_takes_a_while_says_how_far_it_has_come(tmp_path, capsys, monkeypatch):
    """Bug caught: expanding a large matrix printed nothing until it ended (minutes at 100,000 runs): it now
    reports every PROGRESS_EVERY_S seconds on stderr (0 here: at every combination, whatever the clock)."""
    import solbench.spec.resolver as resolver

    monkeypatch.setattr(resolver, "PROGRESS_EVERY_S", 0.0)
    assert cli(["expand", str(SMOKE), "--format", "ids"]) == 0
    captured = capsys.readouterr()
    assert f"expanding {SMOKE}: 0 of 2 combinations resolved" in captured.err, captured.err
    assert f"expanding {SMOKE}: 1 of 2 combinations resolved" in captured.err, captured.err
    assert len(captured.out.split()) == 2  # the ids alone on stdout
    said = []
    load_spec(SMOKE, progress=lambda done, total, seconds: said.append((done, total)))
    assert said == [(0, 2), (1, 2)]


@pytest.mark.parametrize("prefix", ["", " "])
def test_an_empty_or_blank_only_prefix_selects_nothing_and_is_refused(tmp_path, prefix):
    """Bug caught: `--only ''` selected every run (launch/plan.py tested startswith), so `--force --only ''`
    reran the whole spec; run and status now refuse it in one line before anything is written."""
    results = str(tmp_path / "r")
    answers = bounded(tmp_path, ["run", str(SMOKE), "--results", results, "--force", "--only", prefix, "--no-report",
                                 "--run-fn", "_runfns:counting_run", "--quiet"],
                      ["status", str(SMOKE), "--results", results, "--only", prefix])
    for answer, command in zip(answers, ("run", "status")):
        assert f"--only {prefix!r}: no run id (an empty prefix would select every run)" in one_line(answer, command)
    assert not Path(results).exists()
    from solbench.errors import ConfigError
    from solbench.launch.plan import plan_runs

    with pytest.raises(ConfigError, match="an empty prefix would select every run"):
        plan_runs(load_spec(SMOKE), tmp_path / "r", force=True, only=[prefix])


def grammar_spec(folder: Path, prompts: list[str], rewards: str = "[shapes_geneval]") -> Path:
    """The smoke spec evaluating on a prompt file of ``prompts`` in ``folder`` with eval rewards ``rewards``."""
    folder.mkdir(exist_ok=True)
    (folder / "eval.txt").write_text("".join(f"{p}\n" for p in prompts))
    text = SMOKE.read_text().replace("    prompts: shapes/eval\n", f"    prompts: {folder / 'eval.txt'}\n")
    text = text.replace("    rewards: [shapes_geneval]\n", f"    rewards: {rewards}\n")
    assert str(folder / "eval.txt") in text and rewards in text
    spec = folder / "grammar.yaml"
    spec.write_text(text)
    return spec


def test_prompts_outside_the_grammar_are_refused_at_expand_not_in_the_worker(tmp_path):
    """Bug caught: an eval prompt file with a prompt the shapes grammar does not parse expanded; the run failed
    inside its worker at its first evaluation. Expand and run now refuse it naming the spec line, the file and
    the prompt (clipped: a 100,000-character prompt prints no more than a short one)."""
    long_prompt = "x" * 100_000
    spec = grammar_spec(tmp_path, ["a red circle", "root:x:0:0:root:/root:/bin/bash", long_prompt])
    results = str(tmp_path / "r")
    answers = bounded(tmp_path, ["expand", str(spec)], ["run", str(spec), "--results", results, "--quiet"])
    for answer, command in zip(answers, ("expand", "run")):
        line = one_line(answer, command)
        assert f"{spec}:17: run (" in line and f"eval.prompts: {tmp_path / 'eval.txt'}: prompt 'eval-00001' " \
               "('root:x:0:0:root:/root:/bin/bash') is not in the shapes grammar" in line, line
        assert "scores it with shapes_geneval" in line, line
    assert not Path(results).exists()
    spec = grammar_spec(tmp_path / "long", ["a red circle", long_prompt])
    line = one_line(bounded(tmp_path, ["expand", str(spec)])[0], "expand")
    assert "(100,000 characters)" in line and len(line) < 1000, line[:2000]


def test_prompts_the_grammar_parses_or_no_shapes_reward_scores_expand(tmp_path):
    """Bug caught (by the check above going too far): a file of grammar prompts, or of any prompts scored only by
    rewards that do not parse them (colorfulness), must still expand."""
    ok = grammar_spec(tmp_path / "ok", ["a red circle", "two blue squares", "A green triangle above a red circle."])
    free = grammar_spec(tmp_path / "free", ["root:x:0:0", "any words"], rewards="[colorfulness]")
    answers = bounded(tmp_path, ["expand", str(ok), "--format", "ids"], ["expand", str(free), "--format", "ids"])
    assert [a["rc"] for a in answers] == [0, 0], answers


def test_expand_plans_a_spec_whose_prompt_files_are_missing_and_run_refuses_it(tmp_path):
    """Bug caught: `solbench expand experiments/flux_main.yaml` failed on a machine without
    data/pickscore/train.txt and test.txt, so nobody could see the paper's run matrix before downloading its
    prompts. Expand prints the matrix (all 7 methods) and, on stderr, each missing file with the command that
    fetches it; run still refuses before anything is written."""
    flux = str(REPO / "experiments" / "flux_main.yaml")
    results = str(tmp_path / "r")
    expand, ids, run = bounded(tmp_path, {"argv": ["expand", flux], "cwd": str(tmp_path)},
                               {"argv": ["expand", flux, "--format", "ids"], "cwd": str(tmp_path)},
                               {"argv": ["run", flux, "--results", results], "cwd": str(tmp_path)})
    assert expand["rc"] == 0, expand
    assert "28 runs (7 methods: awm, dance_grpo, diffusion_nft, flow_grpo, naive_fp4, naive_scaling, sol_rl)" \
        in expand["stdout"], expand["stdout"]
    for split, line in (("train", 78), ("test", 99)):
        assert (f"warning: {flux}:{line}: " in expand["stderr"]
                and f"prompt file 'data/pickscore/{split}.txt' not found" in expand["stderr"]
                and f"curl -fL -o data/pickscore/{split}.txt https://raw.githubusercontent.com/yifan123/flow_grpo/"
                    f"main/dataset/pickscore/{split}.txt" in expand["stderr"]), expand["stderr"]
    assert f"`solbench run {flux}` refuses the spec until these files are there" in expand["stderr"]
    assert ids["rc"] == 0 and len(ids["stdout"].split()) == 28, ids
    assert run["rc"] == 2 and "prompt file 'data/pickscore/train.txt' not found" in run["stderr"], run
    assert "Traceback" not in run["stderr"] and not Path(results).exists()
