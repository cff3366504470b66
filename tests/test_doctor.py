"""`solbench doctor`: the check functions on this CPU machine and on fake GPUs, and the command."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch

from pathlib import Path

from solbench import doctor
from solbench.doctor import FAIL, INFO, OK, WARN

ROOT = Path(__file__).resolve().parents[1]

GIB = 2**30


class FakeCuda:
    """A torch.cuda stand-in: devices given as (name, (major, minor), free GiB, total GiB)."""

    def __init__(self, *devices):
        self.devices = list(devices)

    def is_available(self):
        return bool(self.devices)

    def device_count(self):
        return len(self.devices)

    def get_device_name(self, i):
        return self.devices[i][0]

    def get_device_capability(self, i):
        return self.devices[i][1]

    def mem_get_info(self, i):
        return self.devices[i][2] * GIB, self.devices[i][3] * GIB


H100 = ("NVIDIA H100 80GB HBM3", (9, 0), 79.0, 80.0)
B200 = ("NVIDIA B200", (10, 0), 178.0, 180.0)
SMALL_B200 = ("NVIDIA B200", (10, 0), 30.0, 180.0)


def _cache(tmp_path, files: dict[str, list[str]]):
    """A Hugging Face hub cache holding the given files (empty content) for each repo id."""
    for repo, names in files.items():
        root = tmp_path / f"models--{repo.replace('/', '--')}"
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / "main").write_text("abc123")
        for name in names:
            path = root / "snapshots" / "abc123" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("{}")
    return tmp_path


def _all_reward_files():
    from solbench.rewards.real import WEIGHTS

    out: dict[str, list[str]] = {}
    for sources in WEIGHTS.values():
        for s in sources:
            out.setdefault(s.repo_id, []).extend(f.split("|")[0] for f in s.files)
    return out


def _pipeline_files(model: str) -> list[str]:
    """Every file a complete diffusers-layout download of ``model`` holds (first alternative of each)."""
    from solbench.models.model_files import COMPONENTS

    return ["model_index.json"] + [f"{folder}/{name.split('|')[-1]}" for folder, names in COMPONENTS[model].items()
                                   for name in names]


def _spec(tmp_path, body: str):
    path = tmp_path / "spec.yaml"
    path.write_text(textwrap.dedent(body))
    return path


FLUX_SPEC = """
    name: flux_check
    launch: local
    base:
      model: {name: flux}
      rewards: {pickscore: 1.0}
      quant: {recipe: nvfp4_flux, backend: %s}
      eval: {rewards: [imagereward, hpsv2]}
    matrix:
      method: [sol_rl]
"""


# ------------------------------------------------------------------------------------------------
# Hardware
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cap, nvfp4, fp8, bf16", [
    ((10, 0), True, True, True), ((10, 3), True, True, True), ((12, 0), True, True, True),
    ((9, 0), False, True, True), ((8, 9), False, True, True), ((8, 0), False, False, True),
    ((8, 6), False, False, True), ((7, 5), False, False, False),
])
def test_native_formats_by_compute_capability(cap, nvfp4, fp8, bf16):
    formats = doctor.native_formats(*cap)
    assert ("NVFP4" in formats, "FP8" in formats, "BF16" in formats) == (nvfp4, fp8, bf16)


def test_recipe_format():
    # Bug caught: the format was read off the recipe's name, so te_delayed_e2m1_flux (per-tensor FP8 E5M2, what
    # Sol-RL's public code runs) needed no low-precision format at all and a GPU without FP8 passed the doctor.
    assert doctor.recipe_format("te_delayed_e2m1_flux") == "FP8"
    assert doctor.recipe_format("nvfp4_flux") == "NVFP4"
    assert doctor.recipe_format("mxfp4_tiny") == "MXFP4"
    assert doctor.recipe_format("fp8_sd3") == "FP8"
    assert doctor.recipe_format("bf16") is None


def test_check_gpus_on_this_machine_matches_torch():
    rows = doctor.check_gpus()
    if torch.cuda.is_available():
        assert [r.item for r in rows] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    else:
        assert len(rows) == 1 and rows[0].status == WARN and rows[0].detail.startswith("none")
        if torch.version.cuda is None:
            assert "no CUDA build" in rows[0].detail


def test_check_gpus_without_gpu_says_so():
    rows = doctor.check_gpus(FakeCuda())
    assert [(r.item, r.status) for r in rows] == [("GPU", WARN)]
    assert "emulated" in rows[0].detail


def test_check_gpus_reports_capability_formats_and_memory():
    rows = doctor.check_gpus(FakeCuda(H100, B200))
    assert [r.item for r in rows] == ["cuda:0", "cuda:1"] and all(r.status == OK for r in rows)
    assert "sm_90" in rows[0].detail and "native FP8+BF16" in rows[0].detail and "79/80 GiB free" in rows[0].detail
    assert "sm_100" in rows[1].detail and "native NVFP4+MXFP4+FP8+BF16" in rows[1].detail


# ------------------------------------------------------------------------------------------------
# Packages
# ------------------------------------------------------------------------------------------------


def _te_row(rows):
    return next(r for r in rows if r.item == "transformer-engine")


def test_packages_transformer_engine_required_only_by_native_backends(monkeypatch):
    real_version = doctor._version
    monkeypatch.setattr(doctor.packages, "_version", lambda d: None if "transformer" in d and "engine" in d else real_version(d))
    monkeypatch.setattr(doctor.importlib.util, "find_spec", lambda name: None)
    assert _te_row(doctor.check_packages(cuda_available=False)).status == WARN
    row = _te_row(doctor.check_packages(cuda_available=True, need_te=True))
    # TE's documented install: the torch extension is compiled against the installed torch
    assert row.status == FAIL and "pip install --no-build-isolation 'transformer_engine[pytorch]" in row.fix
    rows = doctor.check_packages(cuda_available=False)
    assert next(r for r in rows if r.item == "torch").detail.startswith(torch.__version__)
    assert next(r for r in rows if r.item == "transformers").status == OK


def test_packages_installed_te_without_cuda_cannot_be_imported(monkeypatch):
    monkeypatch.setattr(doctor.packages, "_version", lambda d: "2.8.0" if "engine" in d else "1.0")
    assert _te_row(doctor.check_packages(cuda_available=False)).status == INFO
    assert _te_row(doctor.check_packages(cuda_available=False, need_te=True)).status == FAIL


# ------------------------------------------------------------------------------------------------
# Weights
# ------------------------------------------------------------------------------------------------


def test_file_present_in_local_dir_and_hub_cache(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "b.bin").write_text("x")
    assert doctor.file_present(str(local), "a.safetensors|b.bin") == str(local / "b.bin")
    assert doctor.file_present(str(local), "a.safetensors") is None
    cache = _cache(tmp_path / "hub", {"org/model": ["sub/file.json"]})
    hit = doctor.file_present("org/model", "sub/file.json", cache_dir=cache)
    assert hit is not None and hit.endswith("sub/file.json")
    assert doctor.file_present("org/model", "other.json", cache_dir=cache) is None
    assert doctor.file_present("org/absent", "sub/file.json", cache_dir=cache) is None


def test_reward_weights_present_missing_and_embedded(tmp_path):
    files = _all_reward_files()
    del files["openai/clip-vit-large-patch14"]
    cache = _cache(tmp_path, files)
    rows = {r.item: r for r in doctor.check_reward_weights(
        ["pickscore", "hpsv2", "imagereward", "clipscore", "shapes_geneval"], required=True, cache_dir=cache)}
    assert rows["pickscore"].status == rows["hpsv2"].status == rows["imagereward"].status == OK
    assert rows["shapes_geneval"].status == OK and "embedded" in rows["shapes_geneval"].detail
    clip = rows["clipscore"]
    assert clip.status == FAIL and "openai/clip-vit-large-patch14" in clip.detail
    assert clip.fix.startswith("hf download openai/clip-vit-large-patch14")
    assert doctor.check_reward_weights(["clipscore"], cache_dir=cache)[0].status == WARN  # not required


def test_model_weights_gated_missing_and_local_directory(tmp_path):
    rows = {r.item: r for r in doctor.check_model_weights({"flux": None, "tiny": None}, required=True,
                                                           cache_dir=tmp_path)}
    assert rows["tiny"].status == OK
    assert rows["flux"].status == FAIL and "Gated" in rows["flux"].detail
    assert rows["flux"].fix == ("hf download black-forest-labs/FLUX.1-dev --exclude 'flux1-dev.safetensors' "
                                "--exclude 'ae.safetensors'")  # the single-file checkpoints, 24 GB unused
    local = tmp_path / "sana"
    for name in _pipeline_files("sana"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text("{}")
    ok = doctor.check_model_weights({"sana": str(local)}, required=True, cache_dir=tmp_path)[0]
    assert ok.status == OK and str(local) in ok.detail
    (local / "vae/config.json").unlink()
    bad = doctor.check_model_weights({"sana": str(local)}, required=True, cache_dir=tmp_path)[0]
    assert bad.status == FAIL and "vae/config.json" in bad.detail and str(local) in bad.fix


def test_sana_checkpoint_is_checked_and_its_pipeline_needs_no_transformer_weights(tmp_path):
    """Bugs caught (issue 23): sana_main's transformer comes from model.checkpoint (the linear-FFN SANA_LinearFFN.pth),
    which the doctor never looked for, so a machine without it passed the doctor and failed at launch; and the
    doctor asked for the pipeline's transformer weights (3 GB) the run never loads."""
    from solbench.models.sana_linear import DEFAULT_CHECKPOINT, DEFAULT_PIPELINE

    needs = doctor.spec_needs(ROOT / "experiments" / "sana_main.yaml")
    assert needs.checkpoints == {"sana": DEFAULT_CHECKPOINT}
    assert doctor.MODEL_WEIGHTS["sana"].repo_id == DEFAULT_PIPELINE == doctor.default_source("sana", DEFAULT_CHECKPOINT)
    files = [f for f in _pipeline_files("sana") if not (f.startswith("transformer/") and f != "transformer/config.json")]
    cache = _cache(tmp_path, {DEFAULT_PIPELINE: files})
    pipeline, checkpoint = doctor.check_model_weights(needs.models, required=True, cache_dir=cache,
                                                      checkpoints=needs.checkpoints)
    assert pipeline.status == OK, pipeline
    assert checkpoint.status == FAIL and "SANA_LinearFFN.pth" in checkpoint.detail
    assert checkpoint.fix == "hf download yitongl/SANA_LinearFFN --include 'SANA_LinearFFN.pth'"
    _cache(tmp_path, {"yitongl/SANA_LinearFFN": ["SANA_LinearFFN.pth"]})
    assert doctor.check_model_weights(needs.models, required=True, cache_dir=cache,
                                      checkpoints=needs.checkpoints)[1].status == OK
    # without the checkpoint the run loads the transformer from the pipeline: its weights are needed again
    assert doctor.check_model_weights(needs.models, required=True, cache_dir=cache)[0].status == FAIL


@pytest.mark.parametrize("model, component", [("flux", "text_encoder_2"), ("sd3", "text_encoder_3"),
                                               ("sana", "text_encoder"), ("flux", "tokenizer")])
def test_model_weights_missing_a_text_encoder_or_tokenizer_fail(tmp_path, model, component):
    """Bug: the doctor checked only the transformer's and the VAE's files, so a download without its
    text encoders passed the doctor and stopped the run at launch (FluxPipeline.from_pretrained)."""
    cache = _cache(tmp_path, {doctor.default_source(model): [
        f for f in _pipeline_files(model) if not f.startswith(component + "/")]})
    row = doctor.check_model_weights({model: None}, required=True, cache_dir=cache)[0]
    assert row.status == FAIL and f"{component}/" in row.detail, row


def test_model_weights_check_every_shard_an_index_names(tmp_path):
    """A sharded checkpoint with a shard missing (an interrupted download) fails, naming the shard."""
    import json as _json

    local = tmp_path / "flux"
    for name in _pipeline_files("flux"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text("{}")
    index = local / "transformer/diffusion_pytorch_model.safetensors.index.json"
    shards = [f"diffusion_pytorch_model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    index.write_text(_json.dumps({"weight_map": {f"w{i}": shard for i, shard in enumerate(shards)}}))
    for shard in shards[:2]:
        (local / "transformer" / shard).write_text("x")
    (local / "transformer/diffusion_pytorch_model.safetensors").unlink()
    row = doctor.check_model_weights({"flux": str(local)}, required=True)[0]
    assert row.status == FAIL and f"transformer/{shards[2]}" in row.detail
    (local / "transformer" / shards[2]).write_text("x")
    assert doctor.check_model_weights({"flux": str(local)}, required=True)[0].status == OK


def test_model_table_agrees_with_flops_table():
    from solbench.models.flops import REAL_MODELS

    assert {k: v.hub_id for k, v in REAL_MODELS.items()} == {k: v.repo_id for k, v in doctor.MODEL_WEIGHTS.items()}


# ------------------------------------------------------------------------------------------------
# Spec needs and memory
# ------------------------------------------------------------------------------------------------


def _check_flux_needs(needs, native):
    assert set(needs.models) == {"flux"}
    assert needs.rewards == {"pickscore", "imagereward", "hpsv2"}
    assert needs.formats == {"NVFP4"} and needs.native is native and needs.gpu


@pytest.mark.parametrize("backend, native", [("te", True), ("emulated", False)])
def test_spec_needs_minimal_yaml_reading(tmp_path, monkeypatch, backend, native):
    import solbench.spec

    def refuse(path, **kw):
        raise ImportError("simulated: spec module unusable")

    monkeypatch.setattr(solbench.spec, "load_spec", refuse)
    needs = doctor.spec_needs(_spec(tmp_path, FLUX_SPEC % backend))
    _check_flux_needs(needs, native)
    assert needs.notes and "minimally" in needs.notes[0]


def test_spec_needs_through_the_spec_module_or_fallback(tmp_path):
    needs = doctor.spec_needs(_spec(tmp_path, FLUX_SPEC % "te"))
    _check_flux_needs(needs, True)


def test_spec_needs_matrix_of_models(tmp_path, monkeypatch):
    import solbench.spec

    monkeypatch.setattr(solbench.spec, "load_spec", lambda *a, **k: (_ for _ in ()).throw(ImportError("x")))
    path = _spec(tmp_path, """
        name: models
        base: {rewards: {clipscore: 1.0}, world_size: 8}
        matrix: {model: [flux, sana], method: [sol_rl]}
    """)
    needs = doctor.spec_needs(path)
    assert set(needs.models) == {"flux", "sana"} and needs.world_size == 8 and needs.rewards == {"clipscore"}


def test_memory_estimates_and_rows():
    needs = doctor.SpecNeeds(models={"flux": None}, rewards={"pickscore"}, formats={"NVFP4"}, gpu=True, explore=True,
                             micro_batch={"rollout": 8, "reward": 16, "train": 4})
    items = dict(doctor.memory_items(needs, "flux"))
    assert items["weights/policy: policy transformer (bf16, shared by every full-precision role)"] == 23.8
    total = doctor.estimate_gpu_gb(needs)
    acts = [gb for k, gb in items.items() if k.startswith("activations/")]
    assert total == pytest.approx(sum(items.values()) - sum(acts) + max(acts), abs=0.15)
    assert doctor.estimate_gpu_gb(doctor.SpecNeeds(models={"tiny": None})) == 0.0
    big = doctor.check_memory(needs, FakeCuda(B200), host=(500.0, 512.0))
    assert [(r.item, r.status) for r in big if r.status != INFO] == [("cuda:0", OK), ("host", OK)]
    assert {r.item for r in big} >= {"flux/weights/policy", "flux/weights/explore_copy", "flux/weights/rewards",
                                      "flux/activations/train", "flux/total"}
    small = doctor.check_memory(needs, FakeCuda(SMALL_B200), host=(10.0, 16.0))
    assert [(r.item, r.status) for r in small if r.status != INFO] == [("cuda:0", FAIL), ("host", WARN)]
    assert "spec needs ~" in next(r for r in small if r.item == "cuda:0").detail
    # no GPU: the gpu section says so once; memory adds no second "GPU missing" row
    cpu = doctor.check_memory(needs, FakeCuda(), host=(10.0, 16.0))
    assert not [r for r in cpu if r.status == FAIL] and "GPU" not in {r.item for r in cpu}


def _item(items, key):
    return next(gb for name, gb in items if name.startswith(key + ":"))


def test_memory_items_follow_every_setting():
    """Each term moves with what it depends on: catches a copy counted twice or a setting ignored."""
    base = doctor.MemoryProfile(model="flux", resolution=512, rollout=8, reward=16, train=4, explore=True,
                                formats=frozenset({"NVFP4"}), rewards=frozenset({"pickscore", "imagereward"}))
    items = doctor.memory_items(base)
    # one transformer in bf16, LoRA adapters on the side, and NVFP4 explore weights (4.5 bits): no merge
    # target and no BF16 shadow of the explore copy
    assert _item(items, "weights/policy") == 23.8 and _item(items, "weights/explore_copy") < 7.0
    fp8 = doctor.memory_items(doctor.dataclasses.replace(base, formats=frozenset({"FP8"})))
    assert _item(fp8, "weights/explore_copy") == pytest.approx(2 * _item(items, "weights/explore_copy") * 8 / 9, abs=0.2)
    assert "weights/explore_copy" not in {n.split(":")[0] for n, _ in
                                          doctor.memory_items(doctor.dataclasses.replace(base, explore=False))}
    # rewards: one instance each (a reward both trained on and evaluated counts once)
    assert _item(items, "weights/rewards") == pytest.approx((0.99 + 0.47) * 4, abs=0.1)
    double = doctor.memory_items(doctor.dataclasses.replace(base, train=8, rollout=16))
    assert _item(double, "activations/train") == pytest.approx(2 * _item(items, "activations/train"), abs=0.15)
    assert _item(double, "activations/rollout") == pytest.approx(2 * _item(items, "activations/rollout"), abs=0.15)
    offload = doctor.memory_items(doctor.dataclasses.replace(base, cpu_offload=True))
    assert _item(offload, "weights/frozen") == 0.0 and _item(offload, "activations/offload") == 9.8
    hi = doctor.memory_items(doctor.dataclasses.replace(base, resolution=1024))
    assert _item(hi, "activations/train") > 3 * _item(items, "activations/train")


def test_doctor_json_itemises_flux_main_per_rank(capsys):
    from solbench import cli

    cli.main(["doctor", "experiments/flux_main.yaml", "--json"])
    rows = [r for r in json.loads(capsys.readouterr().out) if r["section"] == "memory" and r["item"].startswith("flux/")]
    by_item = {r["item"]: r for r in rows}
    for key in ("weights/policy", "weights/lora", "weights/explore_copy", "weights/frozen", "weights/rewards",
                "caches/prompt_embeddings", "activations/rollout", "activations/decode", "activations/reward",
                "activations/train", "overhead/cuda", "total"):
        assert by_item[f"flux/{key}"]["gb"] is not None, key
    assert "16 samples" in by_item["flux/activations/train"]["detail"]  # the spec's micro_batch.train
    assert "imagereward" in by_item["flux/weights/rewards"]["detail"]
    parts = [r["gb"] for k, r in by_item.items() if k not in ("flux/total", "flux/largest_run")]
    acts = [r["gb"] for k, r in by_item.items() if k.startswith("flux/activations/")]
    assert by_item["flux/total"]["gb"] == pytest.approx(sum(parts) - sum(acts) + max(acts), abs=0.2)
    assert "B200 (180 GB) fits" in by_item["flux/total"]["detail"]


def test_prompt_files_are_checked(tmp_path):
    (tmp_path / "train.txt").write_text("a cat\na dog\n")
    needs = doctor.SpecNeeds(prompt_files={str(tmp_path / "train.txt"), str(tmp_path / "missing.txt")})
    rows = {r.item: r for r in doctor.check_prompt_files(needs)}
    assert rows[str(tmp_path / "train.txt")].status == OK and "2 prompts" in rows[str(tmp_path / "train.txt")].detail
    missing = rows[str(tmp_path / "missing.txt")]
    assert missing.status == FAIL and "Prompt sets" in missing.fix
    assert doctor.spec_needs("experiments/flux_main.yaml").prompt_files == {"data/pickscore/train.txt",
                                                                            "data/pickscore/test.txt"}


def test_model_download_commands_exclude_unused_checkpoints():
    assert doctor.model_download_command("black-forest-labs/FLUX.1-dev") == (
        "hf download black-forest-labs/FLUX.1-dev --exclude 'flux1-dev.safetensors' --exclude 'ae.safetensors'")
    from solbench.rewards.real import download_command

    # hf download reads `--include a b` as pattern a plus a file b: each pattern needs its own flag
    assert download_command("x/y", ("*.json", "*.txt")) == "hf download x/y --include '*.json' --include '*.txt'"


def test_check_spec_native_formats():
    needs = doctor.SpecNeeds(path="x.yaml", models={"flux": None}, formats={"NVFP4"}, native=True, gpu=True)
    assert [r.status for r in doctor.check_spec(needs, FakeCuda(B200)) if r.item == "NVFP4"] == [OK]
    assert [r.status for r in doctor.check_spec(needs, FakeCuda(H100)) if r.item == "NVFP4"] == [FAIL]
    needs.native = False
    assert [r.status for r in doctor.check_spec(needs, FakeCuda(H100)) if r.item == "NVFP4"] == [INFO]


# ------------------------------------------------------------------------------------------------
# All together and the CLI
# ------------------------------------------------------------------------------------------------


def test_run_checks_flux_spec_on_blackwell_with_weights_passes(tmp_path):
    cache = _cache(tmp_path / "hub", {**_all_reward_files(), "black-forest-labs/FLUX.1-dev": _pipeline_files("flux")})
    spec = _spec(tmp_path, FLUX_SPEC % "emulated")
    rows = doctor.run_checks(spec, cuda=FakeCuda(B200, B200), cache_dir=cache)
    assert doctor.exit_code(rows) == 0, [r for r in rows if r.status == FAIL]
    assert {r.item for r in rows if r.section == "rewards"} == {"pickscore", "imagereward", "hpsv2"}
    # the same spec on a CPU-only machine with an empty cache: GPU, weights and memory fail
    rows = doctor.run_checks(spec, cuda=FakeCuda(), cache_dir=tmp_path / "empty")
    failed = {(r.section, r.item) for r in rows if r.status == FAIL}
    assert {("gpu", "GPU"), ("models", "flux"), ("rewards", "pickscore")} <= failed
    assert [r.item for r in rows if "GPU" in r.item or "no CUDA" in r.detail].count("GPU") == 1  # reported once
    flux = next(r for r in rows if r.section == "models" and r.item == "flux")
    assert "--exclude 'flux1-dev.safetensors'" in flux.fix
    assert doctor.exit_code(rows) == 1


def test_run_checks_native_backend_needs_transformer_engine(tmp_path):
    rows = doctor.run_checks(_spec(tmp_path, FLUX_SPEC % "te"), cuda=FakeCuda(B200), cache_dir=tmp_path)
    te = _te_row(rows)
    if doctor._version("transformer-engine") is None and doctor._version("transformer_engine") is None:
        assert te.status == FAIL
    assert doctor.exit_code(rows) == 1


def test_cli_doctor_table_and_json(tmp_path, capsys):
    from solbench import cli

    assert cli.main(["doctor", "--cache-dir", str(tmp_path)]) == 0  # no spec: report only
    out = capsys.readouterr().out
    assert "solbench doctor" in out and "torch" in out and "flux" in out and "imagereward" in out
    spec = _spec(tmp_path, FLUX_SPEC % "emulated")
    code = cli.main(["doctor", str(spec), "--json", "--cache-dir", str(tmp_path)])
    rows = json.loads(capsys.readouterr().out)
    assert {"section", "item", "status", "detail", "fix"} <= set(rows[0])
    flux = next(r for r in rows if r["item"] == "flux")
    assert flux["status"] == FAIL and code == 1


def test_cli_doctor_rows_fit_80_columns(tmp_path, capsys, monkeypatch):
    from solbench import cli

    monkeypatch.setenv("COLUMNS", "80")
    cli.main(["doctor", "experiments/flux_main.yaml", "--cache-dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines if not line.startswith(tuple("0123456789"))) <= 80
    # a row with a fix takes its detail lines plus the fix lines, not 4 to 8 folded table lines
    start = next(i for i, line in enumerate(lines) if line.startswith("  fail flux:"))
    assert lines[start + 3].startswith("       fix: hf download black-forest-labs/FLUX.1-dev") or \
        lines[start + 2].startswith("       fix: hf download black-forest-labs/FLUX.1-dev")


def test_packages_te_installed_but_not_importing_is_reported_with_the_error(monkeypatch):
    """doctor imports transformer_engine.pytorch itself: an installed TE built against another torch or
    CUDA fails there, and the row carries TE's error and the documented reinstall command."""
    monkeypatch.setattr(doctor.packages, "_version", lambda d: "2.8.0" if "engine" in d else "1.0")
    monkeypatch.setattr(doctor.packages, "te_import_error", lambda: "OSError: libcudnn.so.9: cannot open shared object file")
    row = _te_row(doctor.check_packages(cuda_available=True, need_te=True))
    assert row.status == FAIL and "libcudnn.so.9" in row.detail and "--no-build-isolation" in row.fix
    monkeypatch.setattr(doctor.packages, "te_import_error", lambda: None)
    assert _te_row(doctor.check_packages(cuda_available=True, need_te=True)).status == OK


def test_memory_counts_cfg_forwards_from_the_runs_guidance(tmp_path):
    # Bug caught: the doctor doubling activations for every SD3/SANA run (the model's CFG flag) while
    # the NFT family there runs at guidance 1.0, one forward per sample; and the reverse for FlowGRPO.
    path = tmp_path / "g.yaml"
    path.write_text("""
        name: g
        base: {model: {name: sd3}, rewards: {clipscore: 1.0}, world_size: 8, sampling: {guidance: 1.0}}
        matrix: {method: [diffusion_nft]}
    """.replace("\n        ", "\n"))
    one = doctor.spec_needs(path).profiles[0]
    assert one.cfg is False
    two = doctor.dataclasses.replace(one, cfg=None)  # guidance unset: SD3's default CFG 4.5
    rows_one, rows_two = dict(doctor.memory_items(one)), dict(doctor.memory_items(two))
    train_one = next(gb for k, gb in rows_one.items() if k.startswith("activations/train"))
    train_two = next(gb for k, gb in rows_two.items() if k.startswith("activations/train"))
    assert train_two == pytest.approx(2 * train_one, rel=0.02)
    assert any("x 1 forward(s)" in k for k in rows_one) and any("x 2 forward(s)" in k for k in rows_two)
    assert doctor._runs_cfg("sd3", 4.5) is True and doctor._runs_cfg("flux", 3.5) is False


def test_memory_counts_the_runs_text_length():
    """The bug: the doctor counting FLUX's text at the pipeline's 512 T5 tokens while the runs (and the reference
    scripts) encode 128 (model.text_max_length), 6 % over the train phase an H200 measured (docs/measured/H200.md).
    A spec's text_max_length reaches the profile, and more text tokens mean more activation memory."""
    from solbench.models.activations import transformer_text_tokens

    assert transformer_text_tokens("flux") == 128 and transformer_text_tokens("sd3") == 77 + 128
    assert transformer_text_tokens("sd3", 256) == 333 and transformer_text_tokens("sana", 300) == 300
    base = doctor.MemoryProfile(model="flux", resolution=512, rollout=8, reward=16, train=4, explore=True,
                                formats=frozenset({"NVFP4"}))
    long = doctor.dataclasses.replace(base, text_max_length=512)
    assert _item(doctor.memory_items(long), "activations/train") > 1.2 * _item(doctor.memory_items(base),
                                                                              "activations/train")
    assert doctor.memory_items(doctor.dataclasses.replace(base, text_max_length=128)) == doctor.memory_items(base)
    needs = doctor.SpecNeeds()
    doctor._add_run(needs, {"model": {"name": "flux", "resolution": 512, "text_max_length": 512}, "method": "sol_rl"})
    assert needs.profiles[0].text_max_length == 512
