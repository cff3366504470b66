"""A results folder or model folder from someone else cannot read outside it nor exhaust the machine: the files a
stored spec.json names stay inside the results folder or the project (symlinks resolved), a crafted tiny model
config is refused before anything is allocated, a bad weights file is named, and strings from results and prompt
files are clipped where they are printed.

Command lines run under an address-space limit (tests/_bounded_cli.py): a regression fails instead of taking the
machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from solbench.cli import main as cli
from solbench.config import RunConfig
from solbench.errors import ConfigError, MissingWeightsError

from _bounded_cli import REPO, bounded, one_line

ASSETS = REPO / "solbench" / "assets"
SECRET = "SECRET-root:x:0:0:root:/root:/bin/bash"


def stored_run(project: Path, **settings) -> Path:
    """results/exp/run1 in ``project``: a spec.json of the default run with ``settings`` (``eval.prompts``: a
    dotted key) and a checkpoint file that is not one (nothing may read it before the paths are checked)."""
    run_dir = project / "results" / "exp" / "run1"
    (run_dir / "checkpoints").mkdir(parents=True)
    config = RunConfig().to_dict()
    for key, value in settings.items():
        section, name = key.split("__")
        config[section][name] = value
    (run_dir / "spec.json").write_text(json.dumps(config))
    (run_dir / "checkpoints" / "step_1.pt").write_bytes(b"not a checkpoint")
    return run_dir


def everything_under(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink())


def test_a_stored_prompt_path_outside_the_results_and_the_project_is_refused_and_never_read(tmp_path):
    """Bug caught: `fidelity --checkpoint RUN` took eval.prompts from the run's spec.json; pointed at a .txt
    symlink to /etc/passwd it printed the file's first line in its error and stored it in status.json. The path
    is resolved and refused, in one line, before anything of the folder or the file is read."""
    (tmp_path / "secret.txt").write_text(SECRET + "\n")
    project = tmp_path / "project"
    link = stored_run(project / "a", eval__prompts="results/exp/run1/p.txt")
    (link / "p.txt").symlink_to(tmp_path / "secret.txt")
    absolute = stored_run(project / "b", eval__prompts=str(tmp_path / "secret.txt"))
    cases = [{"argv": ["fidelity", "--checkpoint", str(run.relative_to(run.parents[2])), "--results", "results",
                       "--no-report"], "cwd": str(run.parents[2])} for run in (link, absolute)]
    cases.append({"argv": ["fidelity", "--checkpoint", "results/exp/run1/checkpoints/step_1.pt", "--results",
                           "results", "--no-report"], "cwd": str(project / "a")})
    for answer in bounded(tmp_path, *cases):
        line = one_line(answer, "fidelity")
        assert "spec.json names eval.prompts" in line and f"which is {tmp_path / 'secret.txt'}: outside both" in line
        assert "give --prompts to name one yourself" in line, line
        assert "SECRET" not in answer["stdout"] + answer["stderr"]
    for folder in (project / "a", project / "b"):
        assert SECRET.encode() not in everything_under(folder)
        assert sorted(p.name for p in (folder / "results").iterdir()) == ["exp"]  # no fidelity run, no status.json


def test_a_stored_weights_path_outside_is_refused_and_paths_inside_or_given_are_not(tmp_path, monkeypatch):
    """Bug caught: model.path (and model.checkpoint) of a stored spec.json were read wherever they pointed,
    symlinked folders included. Inside the project or the results folder, a Hugging Face id, or a value the
    command line replaces (--prompts, --model-path) are not refused."""
    from solbench.fidelity.checkpoint import _outside, load_checkpoint

    project = tmp_path / "project"
    (tmp_path / "weights").mkdir()
    run_dir = stored_run(project, model__path="results/exp/run1/weights")
    (run_dir / "weights").symlink_to(tmp_path / "weights")
    monkeypatch.chdir(project)
    with pytest.raises(ConfigError, match=r"names model.path 'results/exp/run1/weights', which is .*/weights: "
                                          r"outside both .*; give --model-path to name one yourself") as refused:
        load_checkpoint(run_dir)
    assert len(str(refused.value).splitlines()) == 1
    config = RunConfig.from_dict(json.loads((run_dir / "spec.json").read_text()))
    assert _outside(config, run_dir, given=("model.path",)) is None
    for inside in ("data/pickscore/test.txt", str(run_dir / "prompts.txt"), str(project / "results" / "x.txt"),
                   "black-forest-labs/FLUX.1-dev"):
        config.model.path, config.eval.prompts = inside, inside if inside.endswith(".txt") else "shapes/eval"
        assert _outside(config, run_dir, given=()) is None, inside
    shared = stored_run(tmp_path / "shared")  # a results folder outside the project: its own files are read
    config.model.path, config.eval.prompts = str(shared / "weights"), str(shared.parent / "prompts.txt")
    assert _outside(config, shared, given=()) is None
    assert _outside(config, run_dir, given=()).startswith("eval.prompts ")
    config.model.path, config.eval.prompts = None, "shapes/eval"
    config.model.checkpoint = "/elsewhere/SANA_LinearFFN.pth"
    assert _outside(config, run_dir, given=()).startswith("model.checkpoint '/elsewhere/SANA_LinearFFN.pth'")


def crafted_model(folder: Path, **sizes) -> Path:
    """A model.path folder: the shipped weights beside a tiny_t2i.json with ``sizes`` changed."""
    folder.mkdir(parents=True)
    shutil.copy(ASSETS / "tiny_t2i.safetensors", folder)
    config = json.loads((ASSETS / "tiny_t2i.json").read_text())
    (folder / "tiny_t2i.json").write_text(json.dumps({**config, **sizes}))
    return folder


def test_a_crafted_model_config_is_refused_before_anything_is_allocated_with_its_parameter_count(tmp_path):
    """Bug caught: a model.path folder whose tiny_t2i.json had num_layers 100000 and attention_head_dim 4096 was
    not checked: the run reached 9 GB and tried to allocate 25.7 GB before its one-line error. Expand refuses it
    at the spec line and fidelity before building the model, each naming the sizes and the parameter count."""
    folder = crafted_model(tmp_path / "crafted", num_layers=100_000, attention_head_dim=4096)
    spec = tmp_path / "crafted.yaml"
    spec.write_text((REPO / "experiments" / "smoke.yaml").read_text().replace(
        "  model: {name: tiny}", f"  model: {{name: tiny, path: {folder}}}"))
    expand, fidelity = bounded(tmp_path, ["expand", str(spec)],
                               ["fidelity", "--model-path", str(folder), "--results", str(tmp_path / "r"),
                                "--no-report"])
    for answer, command in ((expand, "expand"), (fidelity, "fidelity")):
        line = one_line(answer, command)
        assert "num_layers 100000 (a whole number from 1 to 64)" in line and "attention_head_dim 4096" in line
        assert "would build about 3,865,607,032,802,352 parameters" in line, line
    assert one_line(expand, "expand").startswith(f"solbench expand: error: {spec}:7: run (")


def test_the_parameter_estimate_is_the_count_of_the_model_built(tmp_path):
    """Bug caught (by a wrong estimate): the bound compares an estimate computed without building the model; it
    must equal the parameters TinyT2I builds (here on the meta device: nothing allocated), for the shipped config
    and wider, deeper and longer-text variants."""
    from dataclasses import asdict

    from solbench.models.tiny import TinyT2I, TinyT2IConfig
    from solbench.models.tiny_bounds import estimated_parameters

    shipped = TinyT2IConfig.from_dict(json.loads((ASSETS / "tiny_t2i.json").read_text()))
    variants = [shipped, TinyT2IConfig(), TinyT2IConfig(num_layers=4, num_single_layers=3, num_attention_heads=8),
                TinyT2IConfig(num_layers=1, num_single_layers=6, num_attention_heads=16, text_dim=128, text_layers=2,
                              max_length=16, patch_size=2, resolution=16)]
    for config in variants:
        with torch.device("meta"):
            model = TinyT2I(config)
        built = sum(p.numel() for part in (model.transformer, model.text_encoder) for p in part.parameters())
        assert estimated_parameters(asdict(config)) == built, config


def test_a_bad_weights_file_is_named_in_its_error(tmp_path):
    """Bug caught: a model.path folder whose tiny_t2i.safetensors was not safetensors failed with safetensors'
    'Error while deserializing header' and no file name."""
    from solbench.models.tiny import load_tiny

    folder = crafted_model(tmp_path / "bad")
    (folder / "tiny_t2i.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(MissingWeightsError, match=f"{folder / 'tiny_t2i.safetensors'} is no safetensors weights "
                                                  "file"):
        load_tiny(folder=folder)
    answer = bounded(tmp_path, ["fidelity", "--model-path", str(folder), "--results", str(tmp_path / "r"),
                                "--no-report"])[0]
    assert f"{folder / 'tiny_t2i.safetensors'} is no safetensors weights file" in one_line(answer, "fidelity")


def test_long_strings_from_results_cost_status_and_collect_no_more_than_short_ones(tmp_path):
    """Bug caught: `status --tracebacks` printed a stored 10 MB error and traceback whole, and the board took a
    10 MB phase from progress.json; a 10 MB metric name and a torn line holding one must not reach the output
    either. Every command's output stays under 40,000 characters and 1 GB."""
    results = tmp_path / "r"
    smoke = str(REPO / "experiments" / "smoke.yaml")
    assert cli(["run", smoke, "--results", str(results), "--run-fn", "_runfns:counting_run", "--no-report",
                "--quiet"]) == 0
    run_dir = sorted((results / "smoke").iterdir())[0]
    big = "m" * 10_000_000
    with open(run_dir / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps({"step": 3, "split": "eval", "metric": big, "value": 1.0, "images_seen": 0,
                                 "wall_s": 0.0}) + "\n")
        handle.write('{"step": 4, "metric": "' + big + "\n")  # torn: reported as a corrupt line
    status = json.loads((run_dir / "status.json").read_text())
    (run_dir / "status.json").write_text(json.dumps({**status, "state": "failed", "error": "E" * 10_000_000,
                                                     "traceback": "T" * 10_000_000}))
    (run_dir / "progress.json").write_text(json.dumps({"step": 1, "iterations": 2, "phase": "P" * 10_000_000}))
    answers = bounded(tmp_path, ["collect", smoke, "--results", str(results)],
                      ["status", smoke, "--results", str(results), "--tracebacks"])
    for answer in answers:
        assert answer["rc"] in (0, 1) and answer["stdout_chars"] + answer["stderr_chars"] < 40_000, \
            (answer["rc"], answer["stdout_chars"], answer["stderr_chars"], answer["stderr"][-1000:])
    assert "(10,000,000 characters; the last 20,000:)" in answers[1]["stdout"]


def test_long_prompts_and_huge_prompt_files_are_one_short_line(tmp_path):
    """Bug caught: a 10 MB prompt outside the grammar made a 10 MB error (printed, and stored in a fidelity run's
    status.json), and a prompt file of any size was read whole."""
    from solbench.world.grammar import PromptParseError, parse_prompt
    from solbench.world.prompts import load_prompt_set

    with pytest.raises(PromptParseError) as refused:
        parse_prompt("x" * 10_000_000)
    assert "(10,000,000 characters)" in str(refused.value) and len(str(refused.value)) < 1000
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as handle:
        handle.truncate(65 * 2**20)  # sparse: no disk
    with pytest.raises(ConfigError, match=f"{huge}: more than 64 MiB, the bound on a prompt file's size"):
        load_prompt_set(str(huge))


def test_a_real_models_local_transformer_config_past_the_published_sizes_is_refused_before_loading(tmp_path):
    """Bug caught: a local model.path folder of a real model was loaded whatever its transformer/config.json said
    (a FLUX with 100,000 layers built before anything was refused). Sizes past twice the published ones are one
    line with the parameters they would build; the published config passes."""
    from solbench.models.flops import REAL_MODELS
    from solbench.models.flux import FluxAdapter
    from solbench.models.real_bounds import config_problem

    (tmp_path / "transformer").mkdir()
    config = tmp_path / "transformer" / "config.json"
    config.write_text(json.dumps(REAL_MODELS["flux"].config))
    assert config_problem("flux", tmp_path) is None
    config.write_text(json.dumps({**REAL_MODELS["flux"].config, "num_layers": 100_000}))
    with pytest.raises(ConfigError, match=r"num_layers 100000 \(a whole number from 1 to 38, 2 x the published 19\): "
                                          r"the config would build about 20,887,597,991,512 parameters"):
        FluxAdapter.from_pretrained(str(tmp_path))
