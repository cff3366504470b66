"""Experiment specs: matrix expansion, dropped axes, precedence, strict errors naming file/line/key,
run ids, launch profiles, and every shipped spec in experiments/ validating."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from solbench.errors import ConfigError
from solbench.spec import check_launch, load_profile, load_spec, runs_table

REPO = Path(__file__).resolve().parent.parent
BASE = """
name: t
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  prompts_per_iter: 4
  iterations: 3
  eval: {every: 1, prompts: shapes/eval, n_prompts: 2, seeds_per_prompt: 1, rewards: [shapes_geneval]}
"""


def write(tmp_path, body: str, base: str = BASE, name="spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(base) + textwrap.dedent(body))
    return path


def test_matrix_is_a_cartesian_product_and_unused_axes_are_dropped(tmp_path):
    spec = load_spec(write(tmp_path, """
        matrix:
          method: [sol_rl, diffusion_nft]
          seed: [0, 1]
          n: [8, 16]
          k: [4]
          group_size: [4]
    """))
    by_method = {}
    for run in spec.runs:
        by_method.setdefault(run.method, []).append(run)
    # sol_rl: seed x n = 4 runs; diffusion_nft ignores n and k: one run per seed, not per n
    assert len(by_method["sol_rl"]) == 4 and len(by_method["diffusion_nft"]) == 2
    assert {(r.config.seed, r.config.method_config["n"]) for r in by_method["sol_rl"]} == {(0, 8), (0, 16), (1, 8), (1, 16)}
    nft = by_method["diffusion_nft"][0]
    assert "n" not in nft.config.method_config and nft.config.method_config["group_size"] == 4
    assert "n" not in nft.axes and nft.axes["group_size"] == 4
    assert any("collapsed" in note for note in spec.notes)
    assert len({r.run_id for r in spec.runs}) == 6
    # method_config is fully resolved: defaults of the method's Config are written out
    assert by_method["sol_rl"][0].config.method_config["explore_steps"] == 6
    assert spec.runs[0].config.experiment == "t"


def test_precedence_base_then_method_overrides_then_matrix(tmp_path):
    spec = load_spec(write(tmp_path, """
        methods:
          sol_rl:
            iterations: 5
            finetune: {lr: 1e-3}
            method_config: {beta: 0.5, n: 12}
        matrix:
          method: [sol_rl, flow_grpo]
          n: [16]
          k: [4]
          group_size: [4]
    """))
    sol = next(r for r in spec.runs if r.method == "sol_rl").config
    grpo = next(r for r in spec.runs if r.method == "flow_grpo").config
    assert sol.iterations == 5 and grpo.iterations == 3
    assert sol.finetune.lr == 1e-3 and grpo.finetune.lr == 3e-4  # 1e-3 parsed as a float, not a string
    assert sol.finetune.lora_rank == 32  # sections merge key by key
    assert sol.method_config["beta"] == 0.5 and sol.method_config["n"] == 16  # the matrix wins


def test_include_ranges_over_missing_matrix_keys_and_exclude_removes(tmp_path):
    spec = load_spec(write(tmp_path, """
        matrix:
          method: [diffusion_nft]
          seed: [0, 1, 2]
        exclude:
          - {method: diffusion_nft, seed: [1, 2]}
        include:
          - {method: naive_fp4, n: 8, k: 2}
    """))
    pairs = sorted((r.method, r.config.seed) for r in spec.runs)
    assert pairs == [("diffusion_nft", 0), ("naive_fp4", 0), ("naive_fp4", 1), ("naive_fp4", 2)]
    fp4 = [r for r in spec.runs if r.method == "naive_fp4"]
    assert all(r.config.method_config["n"] == 8 and r.config.method_config["k"] == 2 for r in fp4)


def test_a_section_set_in_an_include_entry_merges_key_by_key_as_in_base_and_methods(tmp_path):
    """Catches: ``{eval: {explore_gap_every: 8}}`` in an include entry replacing the whole eval section (its
    rewards became null and the expansion died in a TypeError), while the same value under ``methods:`` merges; and
    the training reward weights merged where an entry means to replace them (rewards is a map, not a section)."""
    spec = load_spec(write(tmp_path, """
        matrix:
          method: [diffusion_nft]
        include:
          - {method: naive_fp4, eval: {explore_gap_every: 8}, rewards: {shapes_clip: 1.0}}
    """))
    fp4 = next(r for r in spec.runs if r.method == "naive_fp4").config
    nft = next(r for r in spec.runs if r.method == "diffusion_nft").config
    assert fp4.eval.explore_gap_every == 8 and fp4.eval.rewards == ["shapes_geneval"] and fp4.eval.n_prompts == 2
    assert nft.eval.explore_gap_every != 8
    assert fp4.rewards == {"shapes_clip": 1.0} and nft.rewards == {"shapes_geneval": 1.0}


def test_null_eval_rewards_is_a_clear_error_naming_the_key(tmp_path):
    """Catches: ``eval: {rewards: null}`` in an include entry crashing the expansion with a TypeError (as an
    entry's eval section that replaced the base's did) instead of naming the file, line and key."""
    with pytest.raises(ConfigError, match=r"spec\.yaml:8: .*eval\.rewards: Input should be a valid array, got None"):
        load_spec(write(tmp_path, """
            matrix:
              method: [diffusion_nft]
            include:
              - {method: naive_fp4, eval: {rewards: null}}
        """))


def test_run_id_is_stable_and_excludes_launch(tmp_path):
    body = textwrap.dedent("""
        matrix:
          method: [diffusion_nft]
          model: [tiny]
          finetune.lr: [1.0e-4]
    """)
    a = load_spec(write(tmp_path, body + "launch: local\n", name="a.yaml"))
    b = load_spec(write(tmp_path, body + "launch: debug\n", name="b.yaml"))
    assert [r.run_id for r in a.runs] == [r.run_id for r in b.runs]
    assert a.runs[0].config.finetune.lr == 1e-4
    # an int where a float is expected resolves to the same run as the float
    c = load_spec(write(tmp_path, body.replace("[1.0e-4]", "[0.0001]"), name="c.yaml"))
    assert c.runs[0].run_id == a.runs[0].run_id
    d = load_spec(write(tmp_path, body.replace("[1.0e-4]", "[2.0e-4]"), name="d.yaml"))
    assert d.runs[0].run_id != a.runs[0].run_id


@pytest.mark.parametrize("body, expected", [
    ("matrix: {method: [diffusion_nft]}\nbase2: {}\n", r"spec\.yaml:\d+: base2: unknown key 'base2' \(did you mean 'base'\?\); allowed keys: name"),
    ("matrix: {method: [diffusion_nft]}\n", None),
    ("methods: {sol_rl: {finetune: {lora_rnk: 4}}}\nmatrix: {method: [sol_rl]}\n",
     r"spec\.yaml:\d+: methods\.sol_rl\.finetune\.lora_rnk: unknown key 'lora_rnk' \(did you mean 'lora_rank'\?\); allowed keys: mode, lora_rank"),
    ("matrix: {method: [sol_rl], seed: ['zero']}\n", r"run \(method=sol_rl, seed=zero\): seed: Input should be a valid integer, got 'zero'"),
    ("matrix: {method: [sol_rll]}\n", r"spec\.yaml:\d+: matrix\.method\[0\]: unknown method 'sol_rll' \(did you mean 'sol_rl'\?\); methods: awm, "),
    # a misspelt method beside an axis only it has: the name is the first thing wrong, not "no listed
    # method () has the axis" (the axis check used to run first, on an empty list of known methods)
    ("matrix: {method: [sol_rll], explore_steps: [2]}\n",
     r"spec\.yaml:\d+: matrix\.method\[0\]: unknown method 'sol_rll' \(did you mean 'sol_rl'\?\)"),
    ("matrix: {method: [diffusion_nft]}\ninclude: [{method: sol_rll, explore_steps: 2}]\n",
     r"spec\.yaml:\d+: include\[0\]\.method: unknown method 'sol_rll' \(did you mean 'sol_rl'\?\)"),
    ("matrix: {method: [sol_rl], nn: [4]}\n", r"matrix\.nn: unknown matrix key 'nn' \(did you mean 'n'\?\)"),
    ("matrix: {method: [sol_rl], beta: [0.5]}\n", r"'beta' is a Config field of .*sol_rl.* but not a declared axis"),
    ("matrix: {method: [sol_rl], n: [4], k: [8]}\n", r"run \(method=sol_rl, n=4, k=8\): method_config.*k"),
    ("matrix: {method: [sol_rl], selection: [best]}\n", r"selection.*'best' is not one of"),
    ("matrix: {method: [sol_rl], model: [fluxx]}\n", r"model\.name: unknown model 'fluxx' \(did you mean 'flux'\?\); allowed: flux, sana, sd3, tiny"),
    ("matrix: {method: [sol_rl], world_size: [3]}\n", r"prompts_per_iter: 4 prompt groups do not split over world_size=3"),
    ("matrix: {method: [sol_rl], n: [8], k: [4]}\nmethods: {sol_rl: {method_config: {micro_batch_size: 3}}}\n",
     r"micro_batch_size: 3 does not divide the 16 trained samples per rank"),
    ("matrix: {method: [sol_rl], n: [8], k: [4], finetune.grad_accum: [3]}\nmethods: {sol_rl: {method_config: {micro_batch_size: 4}}}\n",
     r"finetune\.grad_accum: 3 does not divide the 4 micro-batches"),
    ("matrix: {method: [sol_rl], train_prompts: [shapes/nope]}\n", r"train_prompts: unknown prompt set 'shapes/nope'"),
    ("matrix: {method: [sol_rl], iterations: [0]}\n", r"iterations: must be >= 1, got 0"),
    ("matrix: {method: []}\n", r"matrix\.method is an empty list"),
    ("matrix: {method: [sol_rl]}\nexclude: [{seed: 1}]\n", r"exclude\[0\]\.seed: exclude key 'seed' is not a matrix key"),
    ("matrix: {method: [sol_rl], experiment: [x]}\n", r"'experiment' is set by the spec's name"),
    ("matrix: {method: [sol_rl]}\nmatrix: {method: [awm]}\n", r"spec\.yaml:\d+: matrix: duplicate key \(first at line \d+\)"),
    ("matrix: {method: [sol_rl]}\nlaunch: [1]\n", r"launch: Input should be a valid string"),
    # numbers out of range (models.FIELD_BOUNDS): each failed every run after loading the model, with torch's
    # "Invalid learning rate: -0.001" (or a run that trained nothing), naming no key or line
    ("matrix: {method: [sol_rl], finetune.lr: [-1.0e-3]}\n",
     r"spec\.yaml:\d+: run \(method=sol_rl, finetune\.lr=-0\.001\): finetune\.lr: Input should be greater than 0, "
     r"got -0\.001"),
    ("matrix: {method: [sol_rl], finetune.lr: [0.0]}\n", r"finetune\.lr: Input should be greater than 0, got 0\.0"),
    ("methods: {sol_rl: {finetune: {weight_decay: -0.1}}}\nmatrix: {method: [sol_rl]}\n",
     r"spec\.yaml:\d+: methods\.sol_rl\.finetune\.weight_decay: Input should be greater than or equal to 0, got -0\.1"),
    ("matrix: {method: [sol_rl], finetune.grad_clip: [-1.0]}\n",
     r"finetune\.grad_clip: Input should be greater than or equal to 0, got -1\.0"),
    ("matrix: {method: [sol_rl], finetune.adam_betas: [[0.9, 1.0]]}\n",
     r"finetune\.adam_betas\[1\]: Input should be less than 1, got 1\.0"),
    ("matrix: {method: [sol_rl], sampling.shift: [0.0]}\n", r"sampling\.shift: Input should be greater than 0, got 0\.0"),
    # counts below 1 and relations between settings, checked with the whole run
    ("matrix: {method: [sol_rl], eval.every: [0]}\n", r"eval\.every: must be >= 1, got 0"),
    ("matrix: {method: [sol_rl], eval.seeds_per_prompt: [0]}\n", r"eval\.seeds_per_prompt: must be >= 1, got 0"),
    ("matrix: {method: [sol_rl], sampling.steps: [0]}\n", r"sampling\.steps: must be >= 1, got 0"),
    ("matrix: {method: [sol_rl], explore_steps: [12]}\n",
     r"spec\.yaml:\d+: run \(method=sol_rl, explore_steps=12\): method_config\.explore_steps: 12 explore steps exceed "
     r"the full rollout budget sampling\.steps=10"),
    ("matrix: {method: [sol_rl], n: [4], k: [2], explore_steps: [4], sampling.steps: [4]}\n", None),  # equal: fine
    # the fidelity: block runs after training: what it names is checked now
    ("matrix: {method: [sol_rl]}\nfidelity: {checkpoint: sol_rl, explore_steps: 8, steps: 4}\n",
     r"spec\.yaml:\d+: fidelity\.explore_steps: 8 exceeds steps \(4\)"),
    ("matrix: {method: [sol_rl]}\nfidelity: {checkpoint: sol_rl, recipes: [nvfp4_tiny, none, nvfp4_tinny]}\n",
     r"spec\.yaml:\d+: fidelity\.recipes\[2\]: unknown quantization recipe 'nvfp4_tinny' \(did you mean 'nvfp4_tiny'\?\)"),
    ("matrix: {method: [sol_rl]}\nfidelity: {checkpoint: [sol_rl, awm]}\n",
     r"spec\.yaml:\d+: fidelity\.checkpoint\[1\]: 'awm' is no method of the spec's runs \(sol_rl\) nor 'base'"),
    ("matrix: {method: [sol_rl]}\nfidelity: {checkpoint: [sol_rl, base], rewards: [shapes_geneval]}\n", None),
])
def test_invalid_specs_fail_before_running_with_file_line_key_and_allowed_values(tmp_path, body, expected):
    path = write(tmp_path, body)
    if expected is None:  # the control case: the same base is valid
        assert len(load_spec(path).runs) == 1
        return
    with pytest.raises(ConfigError, match=expected):
        load_spec(path)


@pytest.mark.parametrize("body, key", [
    ("matrix:\n  method: [sol_rl]\n  nn: [4]\n", "nn:"),
    # a bad value of a run setting: the line that sets it, not the matrix's first line
    ("matrix:\n  method: [sol_rl]\n  seed: [0]\n  finetune.lr: [-1.0e-3]\n", "finetune.lr:"),
    ("methods:\n  sol_rl:\n    finetune:\n      lr: 1.0e-4\n      grad_clip: -2.0\nmatrix:\n  method: [sol_rl]\n",
     "grad_clip:"),
    ("methods:\n  sol_rl:\n    eval:\n      seeds_per_prompt: 0\nmatrix:\n  method: [sol_rl]\n", "seeds_per_prompt:"),
    ("matrix:\n  method: [sol_rl]\n  seed: [0]\n  explore_steps: [11]\n", "explore_steps:"),
])
def test_line_numbers_point_at_the_offending_key(tmp_path, body, key):
    path = write(tmp_path, body)
    lines = path.read_text().splitlines()
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    line = int(str(info.value).split(":")[1])
    assert lines[line - 1].strip().startswith(key), str(info.value)


@pytest.mark.parametrize("text, where, problem", [
    ("name: t\nbase: {iterations: 3\nmatrix: {method: [sol_rl]}\n", ":3:7:", "expected ',' or '}', but got ':' "
     "(while parsing a flow mapping that began at line 2, column 7)"),
    ("name: t\nmatrix:\n  method: [sol_rl]\n seed: [0]\n", ":4:2:", "expected <block end>, but found"),
    ("name: t\ndescription: 'open\n", ":3:1:", "found unexpected end of stream (while scanning a quoted scalar"),
])
def test_malformed_yaml_is_one_line_naming_the_file_line_and_column(tmp_path, capsys, text, where, problem):
    # Bug caught: PyYAML's own message, several lines naming "<unicode string>" instead of the spec file.
    from solbench.cli import main

    path = tmp_path / "broken.yaml"
    path.write_text(text)
    assert main(["expand", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [f"solbench expand: error: {path}{where} invalid YAML: {err.split('invalid YAML: ')[1]}"]
    assert problem in err and "unicode string" not in err


def test_unknown_reward_is_rejected_when_the_registry_exists(tmp_path):
    from solbench.spec import Registries

    registries = Registries.discover()
    registries.rewards = ["shapes_clip", "shapes_geneval"]
    path = write(tmp_path, "matrix: {method: [diffusion_nft]}\nmethods: {diffusion_nft: {rewards: {shapes_genevl: 1.0}}}\n")
    with pytest.raises(ConfigError, match=r"rewards\.shapes_genevl: unknown reward 'shapes_genevl' \(did you mean "
                                          r"'shapes_geneval'\?\); allowed: shapes_clip, shapes_geneval"):
        load_spec(path, registries=registries)


def test_runs_table_lists_axes_with_dashes_for_dropped_ones(tmp_path):
    spec = load_spec(write(tmp_path, "matrix: {method: [sol_rl, awm], n: [8], k: [2]}\n"))
    columns, rows = runs_table(spec)
    assert columns == ["run_id", "method", "n", "k"]
    assert sorted(r[1:] for r in rows) == [["awm", "-", "-"], ["sol_rl", "8", "2"]]


def test_profiles_load_from_slurm_profiles_and_unknown_names_list_the_known_ones(tmp_path):
    path, local = load_profile("local")
    assert local.executor == "local"
    _, debug = load_profile("debug")
    assert debug.executor == "slurm" and debug.partition == "debug"
    _, gpu = load_profile("gpu")
    assert gpu.gpus_per_node == 8 and gpu.array_parallelism >= 1
    with pytest.raises(ConfigError, match=r"launch profile 'nope' not found .*profiles: .*debug.*gpu.*local"):
        load_profile("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("executor: slurm\ngpus: 8\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: gpus: unknown key 'gpus'.*allowed keys: description, executor"):
        load_profile(str(bad))


SHIPPED = sorted(p.name for p in (REPO / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_spec_validates_and_its_profile_exists(name):
    spec = load_spec(REPO / "experiments" / name)
    assert spec.runs and spec.name == Path(name).stem
    check_launch(spec, *load_profile(spec.launch, spec.path))


def test_ranks_per_run_must_match_the_slurm_profile_before_submission(tmp_path):
    spec = load_spec(write(tmp_path, """
        launch: gpu
        matrix: {method: [diffusion_nft], world_size: [4]}
        """))
    with pytest.raises(ConfigError, match=r"world_size 4 does not match launch profile .*gpu\.yaml.*1 x 8 = 8 ranks"):
        check_launch(spec, *load_profile(spec.launch, spec.path))
    (tmp_path / "odd.yaml").write_text("executor: slurm\ntasks_per_node: 2\ngpus_per_node: 4\n")
    with pytest.raises(ConfigError, match=r"odd\.yaml: tasks_per_node=2 but gpus_per_node=4; .*one rank \(task\) per GPU"):
        check_launch(spec, *load_profile(str(tmp_path / "odd.yaml"), spec.path))
    check_launch(spec, *load_profile("local"))  # torchrun starts the ranks; nothing to check here


def test_shipped_specs_cover_the_paper():
    assert {"flux_main.yaml", "sd35_main.yaml", "sana_main.yaml", "tiny_main.yaml", "smoke.yaml"} <= set(SHIPPED)
    flux = load_spec(REPO / "experiments" / "flux_main.yaml")
    assert {r.method for r in flux.runs} == {"sol_rl", "naive_scaling", "naive_fp4", "diffusion_nft", "flow_grpo",
                                            "dance_grpo", "awm"}
    sol = next(r for r in flux.runs if r.method == "sol_rl").config
    assert (sol.method_config["n"], sol.method_config["k"], sol.method_config["explore_steps"]) == (96, 24, 6)
    assert (sol.world_size, sol.prompts_per_iter, sol.sampling.steps) == (8, 48, 10)
    assert (sol.finetune.lora_rank, sol.finetune.lora_alpha, sol.finetune.lr) == (32, 64, 3e-4)
    assert sol.quant.recipe == "nvfp4_flux" and sol.model.name == "flux"
    assert load_spec(REPO / "experiments" / "sana_main.yaml").runs[0].config.quant.recipe == "nvfp4_sana"
    steps = load_spec(REPO / "experiments" / "ablation_explore_steps.yaml")
    assert sorted(r.config.method_config["explore_steps"] for r in steps.runs) == [2, 4, 6, 8]
    pool = load_spec(REPO / "experiments" / "ablation_n.yaml")
    assert sorted(r.config.method_config["n"] for r in pool.runs) == [24, 48, 72, 96]
    tiny = load_spec(REPO / "experiments" / "tiny_main.yaml")
    assert len({r.method for r in tiny.runs}) == 7 and {r.config.model.name for r in tiny.runs} == {"tiny"}
