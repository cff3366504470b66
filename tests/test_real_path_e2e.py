"""The real-model path end to end on CPU: FLUX, SD3 and SANA x Sol-RL and FlowGRPO, one iteration each.

Each run goes through exactly what a cluster run goes through, only smaller:

- the model: a tiny randomly initialised pipeline of the real diffusers classes (the components of
  tests/test_models_diffusers.py) saved with ``save_pretrained`` and loaded back by
  ``build_adapter(ModelConfig(name=..., path=<dir>))`` -> ``<Model>Adapter.from_pretrained`` (local
  files only);
- the rewards: the registry names of a real spec (``pickscore`` for training; ``pickscore`` and
  ``clipscore`` for evaluation), built by ``rewards.get`` with their default repository ids and
  loaded with ``local_files_only`` from a Hugging Face hub cache laid out as ``hf download`` lays
  it out (refs/main + snapshots/<commit>/), holding a tiny random CLIPModel and tokenizer. That is
  how a run finds its reward weights (HF_HOME / HF_HUB_CACHE); ``solbench doctor`` checks the
  same cache;
- the prompts: a .txt train file and a .jsonl eval file, as docs/real-models.md describes;
- LoRA with the default targets, the emulated explore copy from a quantization recipe, and
  ``solbench.train.trainer.train_run`` with a ``RunStore``.

The real recipes (nvfp4_flux: layers under 1000 features stay in full precision, nvfp4_sana: under
2240) quantize none of the tiny layers, so Sol-RL runs with the model's real recipe at
``min_dim=0`` (its skip patterns unchanged) and the explore copy really is NVFP4;
``test_real_recipes_keep_every_tiny_layer_in_full_precision`` checks what the unchanged recipes do.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from solbench import quant
from solbench.config import EvalConfig, FinetuneConfig, ModelConfig, QuantConfig, RunConfig, SamplingConfig
from solbench.results import RunStore

from test_models_diffusers import flux_components, sana_components, sd3_components
from test_real_rewards import _clip_tokenizer, _tiny_clip

PICKSCORE_REPO = "yuvalkirstain/PickScore_v1"
LAION_REPO = "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
CLIP_L14_REPO = "openai/clip-vit-large-patch14"

TRAIN_PROMPTS = ["a red cube", "two blue balls", "a green tree", "a cat and a dog", "a yellow house"]
EVAL_RECORDS = [{"id": "ev-color", "text": "a blue cube", "skill": "color"},
                {"id": "ev-count", "text": "two red balls", "skill": "counting"}]

# model name -> (components, pipeline class, resolution, the recipe of the paper's spec)
MODELS = {
    "flux": (flux_components, "FluxPipeline", 16, "nvfp4_flux"),   # experiments/flux_main.yaml
    "sd3": (sd3_components, "StableDiffusion3Pipeline", 16, "nvfp4_sd3"),  # experiments/sd35_main.yaml
    "sana": (sana_components, "SanaPipeline", 32, "nvfp4_sana"),  # experiments/sana_main.yaml
}
METHOD_CONFIGS = {
    "sol_rl": {"n": 4, "k": 2, "explore_steps": 2},
    "flow_grpo": {"group_size": 3},
}
PROMPTS_PER_ITER = 2
STEPS = 3


# ------------------------------------------------------------------------------------------------
# Fixtures: pipelines on disk, a hub cache with the reward weights, prompt files
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    """name -> directory of the tiny pipeline saved with save_pretrained (each built once, on demand)."""
    import diffusers

    root = tmp_path_factory.mktemp("pipelines")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            components, pipeline_cls, _, _ = MODELS[name]
            pipe = getattr(diffusers, pipeline_cls)(**components())
            pipe.save_pretrained(root / name)
            built[name] = root / name
        return built[name]

    return get


def _hub_entry(cache: Path, repo_id: str, save) -> None:
    """``repo_id`` in a hub cache as ``hf download`` leaves it: refs/main -> snapshots/<commit>/files."""
    commit = "e2e0" * 10
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    save(snapshot)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)


@pytest.fixture(scope="module")
def reward_hub(tmp_path_factory):
    """A hub cache holding tiny random weights under the real reward repositories' ids.

    PickScore_v1 (CLIPModel), the laion ViT-H-14 tokenizer/processor files and
    openai/clip-vit-large-patch14 (CLIPModel + tokenizer): what `hf download` puts there for the
    pickscore and clipscore rewards (docs/real-models.md, step 3), with a tiny CLIP inside.
    """
    from transformers import CLIPImageProcessor

    cache = tmp_path_factory.mktemp("hub")
    tok = _clip_tokenizer()
    clip = _tiny_clip(tok)

    def laion(d):  # tokenizer, processor and the model config (AutoTokenizer reads config.json)
        tok.save_pretrained(d)
        clip.config.save_pretrained(d)
        CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(d)

    def clip_l14(d):
        clip.save_pretrained(d)
        tok.save_pretrained(d)

    _hub_entry(cache, PICKSCORE_REPO, clip.save_pretrained)
    _hub_entry(cache, LAION_REPO, laion)
    _hub_entry(cache, CLIP_L14_REPO, clip_l14)
    return {"cache": cache, "clip": clip, "tokenizer": tok}


@pytest.fixture
def offline_hub(reward_hub, monkeypatch):
    """Point the Hugging Face cache at ``reward_hub`` (read at call time by huggingface_hub and transformers)."""
    import huggingface_hub.constants as hub_constants

    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(reward_hub["cache"]))
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_CACHE", str(reward_hub["cache"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return reward_hub


@pytest.fixture(scope="module")
def prompt_files(tmp_path_factory):
    """data/pickscore-style prompt files: train.txt (one prompt per line), test.jsonl (id/text/skill)."""
    root = tmp_path_factory.mktemp("data")
    train = root / "train.txt"
    train.write_text("\n".join(TRAIN_PROMPTS) + "\n\n")  # a trailing blank line is ignored
    test = root / "test.jsonl"
    test.write_text("".join(json.dumps(r) + "\n" for r in EVAL_RECORDS))
    return {"train": train, "eval": test}


# ------------------------------------------------------------------------------------------------
# A run, observed
# ------------------------------------------------------------------------------------------------


def _tiny_recipe_name(model: str, monkeypatch) -> str:
    """The model's real recipe with min_dim=0 (same skip patterns), registered for this test."""
    real_recipe = quant.get_recipe(MODELS[model][3])
    name = f"{real_recipe.name}_tiny_widths"
    monkeypatch.setitem(quant.RECIPES, name, real_recipe.replace(name=name, min_dim=0))
    return name


def _run_config(model, method, pipeline_path, prompts, recipe) -> RunConfig:
    return RunConfig(
        experiment=f"e2e_{model}",
        method=method,
        method_config=dict(METHOD_CONFIGS[method]),
        model=ModelConfig(name=model, path=str(pipeline_path), resolution=MODELS[model][2]),
        rewards={"pickscore": 1.0},
        train_prompts=str(prompts["train"]),
        prompts_per_iter=PROMPTS_PER_ITER,
        iterations=1,
        seed=0,
        finetune=FinetuneConfig(mode="lora", lora_rank=4, lora_alpha=8),  # default targets: to_q/k/v, to_out.0
        quant=QuantConfig(recipe=recipe, backend="emulated"),
        sampling=SamplingConfig(steps=STEPS, eval_steps=2),
        eval=EvalConfig(every=1, prompts=str(prompts["eval"]), seeds_per_prompt=1,
                        rewards=["pickscore", "clipscore"], use_ema=True, grid_prompts=2),
        device="cpu",
    )


def _observed_run(cfg: RunConfig, run_dir: Path, monkeypatch):
    """train_run(cfg, store), keeping the Trainer it builds, its LoRA weights before training and
    every rollout its engine returns (observation only: nothing the run computes changes)."""
    from solbench.train import trainer as trainer_module

    seen: dict = {"rollouts": []}

    class ObservedTrainer(trainer_module.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            seen["trainer"] = self
            seen["lora_before"] = {role: [t.detach().clone() for t in self.nets.trainable(role)]
                                   for role in ("policy", "old", "ema") if role in self.nets}
            seen["base_before"] = {k: v.detach().clone() for k, v in self.nets.policy.state_dict().items()
                                   if "lora_" not in k}
            sample = self.engine.sample

            def recording_sample(*a, **kw):
                rollout = sample(*a, **kw)
                seen["rollouts"].append((kw.get("phase"), kw.get("net", "policy"), rollout))
                return rollout

            self.engine.sample = recording_sample

    monkeypatch.setattr(trainer_module, "Trainer", ObservedTrainer)
    store = RunStore(run_dir, cfg.run_id)
    summary = trainer_module.train_run(cfg, store)
    return summary, store, seen


@pytest.mark.parametrize("method", ["sol_rl", "flow_grpo"])
@pytest.mark.parametrize("model", ["flux", "sd3", "sana"])
def test_one_iteration_end_to_end(model, method, pipeline_dir, offline_hub, prompt_files, tmp_path, monkeypatch):
    from peft.tuners.tuners_utils import BaseTunerLayer

    from solbench.rewards.real import CLIPScoreReward, PickScoreReward

    recipe = _tiny_recipe_name(model, monkeypatch) if method == "sol_rl" else MODELS[model][3]
    cfg = _run_config(model, method, pipeline_dir(model), prompt_files, recipe)
    summary, store, seen = _observed_run(cfg, tmp_path / cfg.run_id, monkeypatch)
    trainer = seen["trainer"]
    nets, engine = trainer.nets, trainer.engine
    n_prompts = PROMPTS_PER_ITER

    # -- the run finished its iteration, evaluated before and after, checkpointed ----------------
    cfg_n, cfg_k = METHOD_CONFIGS["sol_rl"]["n"], METHOD_CONFIGS["sol_rl"]["k"]
    group = METHOD_CONFIGS["flow_grpo"]["group_size"]
    expected_images = n_prompts * (cfg_n + cfg_k) if method == "sol_rl" else n_prompts * group
    assert summary["step"] == 1 and summary["images_seen"] == expected_images
    assert set(summary["eval"]) >= {"pickscore", "clipscore"}
    assert store.latest_checkpoint()[0] == 1
    assert (store.run_dir / "samples" / "eval_step_000001.png").is_file()

    # -- the model and the rewards are the real classes, loaded from disk ------------------------
    adapter_cls = {"flux": "FluxAdapter", "sd3": "SD3Adapter", "sana": "SanaAdapter"}[model]
    assert type(trainer.adapter).__name__ == adapter_cls
    assert type(trainer.adapter.pipe).__name__ == MODELS[model][1]
    train_reward = engine.rewards.rewards["pickscore"]
    assert isinstance(train_reward, PickScoreReward) and train_reward.loaded
    assert train_reward.model_id == PICKSCORE_REPO and train_reward.tokenizer_id == LAION_REPO
    assert isinstance(trainer.eval_rewards["clipscore"], CLIPScoreReward) and trainer.eval_rewards["clipscore"].loaded

    # -- only LoRA is trainable; the policy's LoRA moved; the base weights did not --------------
    policy = nets.policy
    lora_layers = [m for m in policy.modules() if isinstance(m, BaseTunerLayer)]
    assert lora_layers, "default LoRA targets matched no layer"
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable), sorted(trainable)
    assert len(trainable) == 2 * len(lora_layers)
    assert {id(p) for p in trainer.params} == {id(p) for n, p in policy.named_parameters() if n in trainable}
    for module in trainer.adapter._frozen_modules():
        assert not any(p.requires_grad for p in module.parameters())
    before = seen["lora_before"]["policy"]
    after = nets.trainable("policy")
    # lora_B starts at zero and only a loss gradient moves it (weight decay keeps zero at zero)
    b_moved = [not torch.equal(a, b) for a, b in zip(after[1::2], before[1::2])]
    assert any(b_moved) and all(float(b.abs().max()) == 0.0 for b in before[1::2])
    assert all(torch.isfinite(t.detach()).all() for t in after)
    base_now = {k: v for k, v in policy.state_dict().items() if "lora_" not in k}
    assert base_now.keys() == seen["base_before"].keys()
    assert all(torch.equal(base_now[k], v) for k, v in seen["base_before"].items())
    # EMA took one step towards the policy
    ema_before, ema_after = seen["lora_before"]["ema"], nets.trainable("ema")
    assert any(not torch.equal(a, b) for a, b in zip(ema_after, ema_before))
    # the checkpoint holds exactly these LoRA tensors
    _, state = store.latest_checkpoint()
    assert all(torch.equal(a, b) for a, b in zip(state["nets"]["trainable"]["policy"], after))

    # -- tables -------------------------------------------------------------------------------------
    metrics = store.read("metrics")
    train_metrics = {r["metric"]: r["value"] for r in metrics if r["split"] == "train"}
    for key in ("loss", "reward", "reward_all", "grad_norm", "lr"):
        assert key in train_metrics and math.isfinite(train_metrics[key]), (key, train_metrics)
    assert train_metrics["grad_norm"] > 0
    eval_rows = [r for r in metrics if r["split"] == "eval"]
    assert sorted({r["step"] for r in eval_rows}) == [0, 1]
    for step in (0, 1):
        names = {r["metric"] for r in eval_rows if r["step"] == step}
        assert names == {f"{reward}{suffix}" for reward in ("pickscore", "clipscore")
                         for suffix in ("", "/color", "/counting")}, names
    assert all(math.isfinite(r["value"]) for r in eval_rows)

    candidates = store.read("candidates")
    assert {r["step"] for r in candidates} == {1}
    prompt_ids = sorted({r["prompt_id"] for r in candidates})
    assert len(prompt_ids) == n_prompts and all(p.startswith("train-") for p in prompt_ids)  # .txt ids: <stem>-<index>
    timings = store.read("timings")
    phases = {(r["phase"], r["precision"]) for r in timings if r["step"] == 1}

    rollouts = seen["rollouts"]
    if method == "sol_rl":
        for pid in prompt_ids:
            explore = [r for r in candidates if r["prompt_id"] == pid and r["precision"] == "explore"]
            full = [r for r in candidates if r["prompt_id"] == pid and r["precision"] == "full"]
            assert len(explore) == cfg_n and len(full) == cfg_k
            assert sorted(r["cand_idx"] for r in explore) == list(range(cfg_n))
            chosen = sorted((r["cand_idx"], r["noise_seed"]) for r in explore if r["selected"])
            assert len(chosen) == cfg_k and all(r["selected"] for r in full)
            assert sorted((r["cand_idx"], r["noise_seed"]) for r in full) == chosen  # the same seeds, regenerated
            # best_worst: the best floor(K/2) and the worst ceil(K/2) proxy rewards are kept
            ranked = sorted(explore, key=lambda r: -r["reward"])
            assert {r["cand_idx"] for r in ranked[: cfg_k // 2] + ranked[len(ranked) - (cfg_k - cfg_k // 2):]} == \
                {c for c, _ in chosen}
        assert {("explore", "explore"), ("select", ""), ("regenerate", "full"), ("reward", "explore"),
                ("reward", "full"), ("train", "full"), ("sync", "explore")} <= phases, phases
        assert train_metrics["reward_all"] == pytest.approx(
            sum(r["reward"] for r in candidates if r["precision"] == "explore") / (n_prompts * cfg_n), rel=1e-5)

        # the explore copy is NVFP4 (emulated), built from the recipe, and its rollouts say so
        explore_net = nets["explore"]
        summary_rows = quant.quantization_summary(explore_net)
        real_recipe = quant.get_recipe(MODELS[model][3])
        for row in summary_rows:
            assert row.quantized == (real_recipe.matching_skip_pattern(row.name) is None), row
        assert any(isinstance(m, quant.QuantLinear) for m in explore_net.modules())
        by_phase = {phase: r for phase, _, r in rollouts}
        assert by_phase["explore"].precision == "explore" and by_phase["explore"].dtype == f"{recipe}(float32)"
        assert by_phase["regenerate"].precision == "full" and by_phase["regenerate"].dtype == "float32"
        assert by_phase["explore"].sampler.steps == METHOD_CONFIGS["sol_rl"]["explore_steps"]
        assert by_phase["regenerate"].sampler.steps == STEPS
        # after the update the copy was re-synced from the old policy: quantized(merged old weights)
        merged_old = nets.merged_state_dict("old")
        layer = next(r.name for r in summary_rows if r.quantized)
        torch.testing.assert_close(explore_net.get_submodule(layer).weight,
                                   quant.fake_quantize(merged_old[f"{layer}.weight"], "nvfp4", (16, 16)))
        # ... and computes something else than the full-precision network it mirrors
        x = torch.randn(2, *trainer.adapter.latent_shape)
        cond = trainer.adapter.encode(TRAIN_PROMPTS[:2])
        t = torch.tensor([0.7, 0.3])
        with torch.no_grad():
            v_explore = trainer.adapter.velocity(explore_net, x, t, cond)
            v_old = trainer.adapter.velocity(nets["old"], x, t, cond)
        assert not torch.allclose(v_explore, v_old)
        assert torch.isfinite(v_explore).all()
    else:
        for pid in prompt_ids:
            rows = [r for r in candidates if r["prompt_id"] == pid]
            assert len(rows) == group and {r["precision"] for r in rows} == {"full"}
            assert sorted(r["cand_idx"] for r in rows) == list(range(group))
        assert any(r["selected"] for r in candidates)
        assert "explore" not in nets
        assert {("rollout", "full"), ("reward", "full"), ("train", "full")} <= phases, phases
        assert not {p for p, _ in phases} & {"explore", "regenerate", "sync"}
        (_, net, rollout), = [x for x in rollouts if x[0] == "rollout"]
        assert net == "policy" and rollout.dtype == "float32" and rollout.trajectory is not None
        assert rollout.trajectory.log_probs.shape == (n_prompts * group, STEPS)
    assert {r["phase"] for r in timings if r["step"] == 0} == {"eval"}

    # -- the rewards recorded are the tiny CLIP's scores of the generated images ------------------
    reference = PickScoreReward(model=offline_hub["clip"], tokenizer=offline_hub["tokenizer"], device="cpu")
    scored = [r for phase, _, r in rollouts if phase in ("regenerate", "rollout")]
    assert len(scored) == 1
    rollout = scored[0]
    torch.testing.assert_close(rollout.rewards, reference(rollout.images, rollout.prompts))
    full_rows = {(r["prompt_id"], r["cand_idx"]): r["reward"] for r in candidates if r["precision"] == "full"}
    for pid, c, value in zip(rollout.prompt_ids, rollout.cand_idx, rollout.rewards.tolist()):
        assert full_rows[(pid, c)] == pytest.approx(value)
    assert rollout.images.shape[-1] == MODELS[model][2] and 0 <= rollout.images.min() <= rollout.images.max() <= 1


def test_reward_hub_is_what_doctor_expects(offline_hub):
    """The cache the e2e runs read is complete by the doctor's own list of required files."""
    from solbench import doctor

    rows = doctor.check_reward_weights(["pickscore", "clipscore"], required=True, cache_dir=offline_hub["cache"])
    assert [(r.item, r.status) for r in rows] == [("pickscore", "ok"), ("clipscore", "ok")]


def test_doctor_and_loader_agree_on_the_laion_tokenizer_files(reward_hub, tmp_path, monkeypatch):
    """AutoTokenizer reads config.json from a hub repo: without it doctor says missing and loading fails."""
    import shutil

    import huggingface_hub.constants as hub_constants

    from solbench import doctor
    from solbench.errors import MissingWeightsError
    from solbench.rewards.real import PickScoreReward

    cache = tmp_path / "hub"
    shutil.copytree(reward_hub["cache"], cache)
    for config in cache.glob(f"models--{LAION_REPO.replace('/', '--')}/snapshots/*/config.json"):
        config.unlink()
    (row,) = doctor.check_reward_weights(["pickscore"], required=True, cache_dir=cache)
    assert row.status == "fail" and "config.json" in row.detail, row
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(MissingWeightsError, match="pickscore tokenizer"):
        PickScoreReward(device="cpu").load()


def test_rewards_also_load_from_local_directories(reward_hub, tmp_path):
    """The Python route to local weights (docs/real-models.md): a save_pretrained folder per model."""
    from solbench.rewards.real import CLIPScoreReward, PickScoreReward

    clip, tok = reward_hub["clip"], reward_hub["tokenizer"]
    clip.save_pretrained(tmp_path / "pickscore")
    tok.save_pretrained(tmp_path / "tokenizer")  # no config.json needed in a local folder
    images = torch.rand(3, 3, 24, 24, generator=torch.Generator().manual_seed(0))
    prompts = TRAIN_PROMPTS[:3]
    local = PickScoreReward(model_id=str(tmp_path / "pickscore"), tokenizer_id=str(tmp_path / "tokenizer"), device="cpu")
    torch.testing.assert_close(local(images, prompts), PickScoreReward(model=clip, tokenizer=tok, device="cpu")(images, prompts))
    tok.save_pretrained(tmp_path / "pickscore")
    local_clip = CLIPScoreReward(model_id=str(tmp_path / "pickscore"), device="cpu")
    torch.testing.assert_close(local_clip(images, prompts), CLIPScoreReward(model=clip, tokenizer=tok, device="cpu")(images, prompts))


@pytest.mark.parametrize("model", ["flux", "sd3", "sana"])
def test_real_recipes_keep_every_tiny_layer_in_full_precision(model):
    """Why the e2e runs use min_dim=0: at the tiny widths the paper's recipes quantize (almost) nothing.

    SANA's cross-attention k/v are exempt from the size rule (the reference's fused kv_linear is
    above it), so they are all SANA quantizes here.
    """
    components, _, _, recipe_name = MODELS[model]
    transformer = components()["transformer"]
    rows = quant.quantization_summary(quant.quantized_copy(transformer, recipe_name))
    quantized = {r.name for r in rows if r.quantized}
    if model == "sana":
        assert quantized and all(name.endswith(("attn2.to_k", "attn2.to_v")) for name in quantized), quantized
    else:
        assert rows and not quantized, quantized
    assert all("min_dim" in r.reason or "skip pattern" in r.reason for r in rows if not r.quantized)


# ------------------------------------------------------------------------------------------------
# The explore-copy factory's backends
# ------------------------------------------------------------------------------------------------


def _small_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))


@pytest.fixture
def no_te(monkeypatch):
    """Backend te unavailable, as on this CPU machine; on a Blackwell node with TransformerEngine
    the real reason is None, so the tests pretend the package is missing to exercise the fallback."""
    real = quant.layers.te_unavailable_reason

    def reason(recipe):
        return real(recipe) or "transformer_engine is not installed (simulated by the test)"

    monkeypatch.setattr(quant.layers, "te_unavailable_reason", reason)


def test_quant_explore_fns_te_without_fallback_raises_backend_unavailable(no_te):
    from solbench.train.trainer import quant_explore_fns

    factory, _ = quant_explore_fns(QuantConfig(recipe="nvfp4_w4a4", backend="te", allow_emulated_fallback=False))
    with pytest.raises(quant.BackendUnavailableError) as err:
        factory(_small_net())
    message = str(err.value)
    reason = quant.layers.te_unavailable_reason(quant.get_recipe("nvfp4_w4a4"))
    assert message.startswith(f"recipe 'nvfp4_w4a4': {reason}.")  # what is missing here, e.g. no CUDA device
    assert "pip install transformer-engine[pytorch]" in message and "backend='emulated'" in message


@pytest.mark.parametrize("backend", ["te", "auto"])
def test_quant_explore_fns_te_with_fallback_emulates_and_warns(backend, caplog, no_te, monkeypatch):
    from solbench.machine import cpu
    from solbench.train.trainer import quant_explore_fns

    # a CPU without bf16 units (with them, auto explores on cpu_bf16: tests/test_quant_cpu_bf16.py)
    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: False)
    source = _small_net()
    factory, sync = quant_explore_fns(QuantConfig(recipe="nvfp4_w4a4", backend=backend, allow_emulated_fallback=True))
    with caplog.at_level(logging.WARNING, logger="solbench.train.trainer"):
        copy = factory(source)
    assert any(r.levelno == logging.WARNING and "te" in r.getMessage() and "nvfp4_w4a4" in r.getMessage()
               for r in caplog.records), caplog.text
    layers = [m for m in copy.modules() if isinstance(m, (quant.QuantLinear, quant.TELinear))]
    assert len(layers) == 2 and all(isinstance(m, quant.QuantLinear) for m in layers)
    assert factory.choice.backend == "emulated" and all(m.recipe.name == "nvfp4_w4a4" for m in layers)
    assert all(r.quantized for r in quant.quantization_summary(copy))
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert not torch.allclose(copy(x), source(x))
        torch.testing.assert_close(copy[0].weight, quant.fake_quantize(source[0].weight, "nvfp4", (16, 16)))
        source[0].weight.mul_(2.0)
        sync(copy, source)  # the sync function refreshes the emulated copy from new weights
        torch.testing.assert_close(copy[0].weight, quant.fake_quantize(source[0].weight, "nvfp4", (16, 16)))
    assert not any(p.requires_grad for p in copy.parameters())
