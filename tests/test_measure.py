"""`solbench doctor SPEC --measure` at tiny shapes: the code path a GPU runs at published shapes.

A FLUX spec with the real-model settings that matter (LoRA, gradient checkpointing, micro-batches,
the NVFP4 FLUX recipe with backend te, four real rewards) is measured through the CLI: the real
pipeline classes built from solbench/models/published/flux.json's tiny section with random weights,
one iteration per method through the Trainer, per-phase seconds and peak memory beside the doctor's
prediction, written as measure.json and measure.md.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from solbench import cli

SPEC = """
    name: measure_check
    launch: local
    base:
      model: {name: flux, resolution: 512, gradient_checkpointing: true}
      rewards: {pickscore: 1.0}
      train_prompts: data/pickscore/train.txt
      prompts_per_iter: 16
      world_size: 8
      device: cuda
      micro_batch: {rollout: 4, reward: 4, train: 2}
      finetune: {lora_rank: 4, lora_alpha: 8, optimizer_steps: 1}
      quant: {recipe: nvfp4_flux, backend: te}
      sampling: {steps: 2, eval_steps: 2, guidance: 1.0}
      eval: {prompts: data/pickscore/test.txt, n_prompts: 2, seeds_per_prompt: 1,
             rewards: [imagereward, clipscore, pickscore, hpsv2]}
    methods:
      sol_rl: {method_config: {timestep_fraction: 0.5}}
      naive_scaling: {method_config: {timestep_fraction: 0.5}}
    matrix:
      method: [diffusion_nft, naive_scaling, sol_rl]
      n: [4]
      k: [2]
      explore_steps: [1]
      group_size: [2]
"""


@pytest.fixture
def spec(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the spec's prompt files do not exist here, as on the GPU machine
    path = tmp_path / "measure_check.yaml"
    path.write_text(textwrap.dedent(SPEC))
    return path


def test_measure_runs_each_method_once_and_writes_json_and_markdown(spec, tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["doctor", str(spec), "--measure", "--tiny", "--out", str(out),
                     "--methods", "sol_rl,naive_scaling"]) == 0
    result = json.loads((out / "measure.json").read_text())
    assert [m["method"] for m in result["methods"]] == ["sol_rl", "naive_scaling"]  # the headline pair first
    sol, naive = result["methods"]
    assert [p["phase"] for p in sol["phases"]] == ["explore", "reward", "select", "regenerate", "reward", "train", "sync"]
    assert [p["phase"] for p in naive["phases"]] == ["rollout", "reward", "select", "train"]
    explore = sol["phases"][0]
    assert explore["precision"] == "explore" and explore["n_images"] == 4  # one prompt group of N = 4
    assert sol["phases"][3]["n_images"] == 2  # K = 2 regenerated
    for row in sol["phases"] + naive["phases"]:
        assert row["seconds"] > 0 and row["predicted_gb"] is not None
        if row["phase"] in ("explore", "regenerate", "rollout", "train"):
            assert row["peak_gb"] > 0 and row["flops"] > 0 and row["seconds_per_forward"] > 0
    # no GPU here: te and torch are passed over and the run says so; the doctor's items are the spec's
    # (and on a CPU with bf16 units auto explores on them: issue 45's cpu_bf16)
    from solbench.machine.cpu import native_bf16

    assert sol["backend"] == ("cpu_bf16" if native_bf16() else "emulated") and "passed over te" in " ".join(sol["notes"])
    assert sol["predicted"]["weights/explore_copy"] > 0 and "weights/explore_copy" not in naive["predicted"]
    assert not sol["error"] and not naive["error"]
    page = (out / "measure.md").read_text()
    assert page.startswith("# Measured: measure_check.yaml on CPU")
    assert page.count("| sol_rl |") == 7 and page.count("| naive_scaling |") == 4
    assert "Not measured by construction" in page and "measure.md" in capsys.readouterr().out


def test_measure_starts_no_method_past_its_budget(spec, tmp_path):
    out = tmp_path / "out"
    assert cli.main(["doctor", str(spec), "--measure", "--tiny", "--out", str(out), "--budget", "0"]) == 0
    result = json.loads((out / "measure.json").read_text())
    assert result["methods"] == []
    assert [m["method"] for m in result["left_out"]] == ["sol_rl", "naive_scaling", "diffusion_nft"]
    assert all("time budget" in m["why"] for m in result["left_out"])


def test_measure_names_an_unknown_method(spec, tmp_path, capsys):
    assert cli.main(["doctor", str(spec), "--measure", "--tiny", "--out", str(tmp_path), "--methods", "awm"]) == 2
    assert "--methods: awm not in" in capsys.readouterr().err


def test_a_cuda_error_keeps_the_phases_measured_names_its_phase_and_leaves_the_rest_out(spec, tmp_path, monkeypatch):
    """The bugs: a non-OOM error in the iteration dropping every phase measured before it (flux_main on an
    H200 hit an illegal memory access in train), or the next method being run on a dead CUDA context."""
    from solbench.train.trainer import Trainer

    def broken(self, *args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(Trainer, "optimize", broken)
    out = tmp_path / "out"
    assert cli.main(["doctor", str(spec), "--measure", "--tiny", "--out", str(out)]) == 1
    result = json.loads((out / "measure.json").read_text())
    (sol,) = result["methods"]
    assert [p["phase"] for p in sol["phases"]] == ["explore", "reward", "select", "regenerate", "reward"]
    assert sol["error"] == "RuntimeError in phase train: CUDA error: an illegal memory access was encountered"
    assert sol["context_lost"]
    assert [m["method"] for m in result["left_out"]] == ["naive_scaling", "diffusion_nft"]
    assert all("CUDA context was lost in sol_rl's run" in m["why"] for m in result["left_out"])
    assert "**stopped: RuntimeError in phase train" in (out / "measure.md").read_text()


def test_isolate_measures_each_method_in_its_own_process_past_one_that_dies(spec, tmp_path, monkeypatch):
    """The bug: one method's process dying (a lost CUDA context, a segfault) ending the measurement. With
    --isolate each method runs in a child `solbench doctor --measure --methods M`; sol_rl's child is made to
    die in train here (a sitecustomize the children import), naive_scaling's is measured as usual."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(textwrap.dedent("""
        import os
        from solbench.train.trainer import Trainer
        _optimize = Trainer.optimize
        def optimize(self, *args, **kwargs):
            if self.cfg.method == "sol_rl":
                os._exit(3)
            return _optimize(self, *args, **kwargs)
        Trainer.optimize = optimize
    """))
    monkeypatch.setenv("PYTHONPATH", str(hook))
    out = tmp_path / "out"
    assert cli.main(["doctor", str(spec), "--measure", "--tiny", "--isolate", "--out", str(out),
                     "--methods", "sol_rl,naive_scaling"]) == 1
    result = json.loads((out / "measure.json").read_text())
    sol, naive = result["methods"]
    assert sol["method"] == "sol_rl" and sol["error"].startswith("its process exited 3 without a result")
    assert not naive["error"] and [p["phase"] for p in naive["phases"]] == ["rollout", "reward", "select", "train"]
    assert result["isolated"] and result["device"].startswith("CPU") and result["left_out"] == []
    assert "each method in its own process" in (out / "measure.md").read_text()
