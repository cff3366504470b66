"""One place per model: each adapter module's ModelCard (solbench.models.card) is all generic code knows of it.

A model added by its card alone gets expansion defaults, a builder, FLOP counts, file and weight checks from the
doctor; the generic modules hold no per-model table of their own.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import pytest

import solbench
from solbench import doctor
from solbench.config import ModelConfig
from solbench.errors import ConfigError
from solbench.models import (DEFAULT_EXPLORE_RECIPES, LORA_INITS, MICRO_BATCH_DEFAULTS, build_adapter, card, cards,
                             check_model_settings, default_lora_init, model_names, native_resolution,
                             reference_defaults)
from solbench.models import activations, flops
from solbench.models.card import ModelCard, ModelWeights, Probe
from solbench.models.model_files import DIFFUSERS_MODEL, SCHEDULER, missing_files
from solbench.quant import RECIPES

ROOT = Path(solbench.__file__).resolve().parent

# A FLUX-class transformer small enough to count on the meta device in a moment.
_FAKE_CONFIG = dict(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
                    num_attention_heads=2, joint_attention_dim=16, pooled_projection_dim=8, axes_dims_rope=[2, 2, 4])


def _fake_card(built: list) -> ModelCard:
    def build(cfg, device, dtype):
        built.append((cfg.name, str(device), dtype))
        from solbench.models.tiny import load_tiny
        from solbench.models.tiny_adapter import TinyAdapter

        return TinyAdapter(load_tiny(pretrained=False, device=device), device=device, full_dtype=dtype)

    return ModelCard(
        name="fake", build=build, explore_recipe="nvfp4_flux", lora_init="kaiming",
        micro_batch={"rollout": 3, "reward": 5, "train": 2}, native_resolution=64, text_max_length=8,
        text_prefix_tokens=4, settings=("text_max_length",), setting_defaults={},
        weights=ModelWeights("fake", "Fake-1", "someone/fake-1", False, "none", 0.01, 0.01),
        files={"transformer": DIFFUSERS_MODEL, "scheduler": SCHEDULER},
        transformer=flops.RealModelSpec(hub_id="someone/fake-1", class_name="FluxTransformer2DModel",
                                        config=_FAKE_CONFIG, resolution=64, vae_factor=8, text_tokens=8, pack=2),
        vae="kl16", probe=Probe({}, 16, {16: 8, 64: 16}))


@pytest.fixture
def fake(monkeypatch):
    built: list = []
    monkeypatch.setitem(cards(), "fake", _fake_card(built))
    return built


def test_every_registered_model_has_a_complete_card():
    """Catches: a model registered with a card that leaves out what generic code reads of it (a real model
    without its files, FLOP architecture, probe or weights; an explore recipe or LoRA init that does not
    exist), which would fail only when a doctor or a run reached that model."""
    assert model_names() == ["flux", "sana", "sd3", "tiny"]
    for name, c in cards().items():
        assert c.name == name and callable(c.build)
        assert c.explore_recipe in RECIPES and c.lora_init in LORA_INITS
        assert set(c.micro_batch) == {"rollout", "reward", "train"}
        if c.weights is None:  # embedded: its architecture comes from its shipped weights
            assert c.architecture is not None and flops.model_architecture(name)[0]
            continue
        assert c.weights.key == name and c.transformer.hub_id == c.weights.repo_id
        assert c.files and "transformer" in c.files and c.vae in flops.VAE_CONFIGS
        assert c.native_resolution == c.transformer.resolution and c.text_max_length
        assert c.probe is not None and activations.PROFILES[name].width == c.weights.hidden
        assert hasattr(c.adapter, "from_components") and c.pipeline
        assert (ROOT / "models" / "published" / f"{name}.json").is_file()


def test_a_model_registered_with_only_its_card_gets_the_generic_behaviour(fake, tmp_path):
    """Catches: a generic module keeping its own per-model table (micro-batches, LoRA init, text length, FLOP
    architecture, VAE, files, weights), so that a new model's card is not enough and the model silently gets
    another model's values or a KeyError."""
    assert MICRO_BATCH_DEFAULTS["fake"] == {"rollout": 3, "reward": 5, "train": 2}
    assert native_resolution("fake") == 64 and default_lora_init("fake") == "kaiming"
    assert DEFAULT_EXPLORE_RECIPES["fake"] == "nvfp4_flux"
    assert reference_defaults("fake") == {"model": {"text_max_length": 8}, "finetune": {"lora_init": "kaiming"}}
    assert activations.transformer_text_tokens("fake") == 4 + 8
    check_model_settings(ModelConfig(name="fake", text_max_length=16))
    with pytest.raises(ConfigError, match="prompt_instruction"):
        check_model_settings(ModelConfig(name="fake", prompt_instruction=True))

    # FLOPs from the card's architecture: one forward of 4 x 4 packed image tokens and 8 text tokens
    cls, config, shape = flops.model_architecture("fake")
    assert (cls, shape) == ("FluxTransformer2DModel", (16, 8))
    assert flops.REAL_MODELS["fake"].forward_flops() == flops.flux_forward_flops(_FAKE_CONFIG, image_tokens=16,
                                                                                  text_tokens=8) > 0
    assert flops.vae_decode_flops("fake", 64) == flops.vae_decode_flops("flux", 64)

    # the doctor's file check walks the card's components; its weight rows name the card's repository
    assert missing_files("fake", lambda name: None) == [
        "model_index.json", "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors.index.json|transformer/diffusion_pytorch_model.safetensors",
        "scheduler/scheduler_config.json"]
    [row] = doctor.check_model_weights({"fake": None}, cache_dir=tmp_path)
    assert row.status == doctor.WARN and "Fake-1 (someone/fake-1): missing model_index.json" in row.detail
    local = tmp_path / "fake-1"
    for name in ("model_index.json", "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
                 "scheduler/scheduler_config.json"):
        (local / name).parent.mkdir(parents=True, exist_ok=True)
        (local / name).write_text(json.dumps({}))
    [row] = doctor.check_model_weights({"fake": str(local)}, cache_dir=tmp_path)
    assert row.status == doctor.OK and "fake" in doctor.MODEL_WEIGHTS and "fake" not in doctor.EMBEDDED_MODELS

    # the builder is the card's
    adapter = build_adapter(ModelConfig(name="fake", full_dtype="float32"))
    assert fake == [("fake", "cpu", adapter.full_dtype)]


def test_an_unknown_model_name_fails_with_close_matches():
    """Catches: a misspelt model.name failing with a bare KeyError deep in a generic module instead of one
    line that names the known models and the nearest one."""
    with pytest.raises(ConfigError, match=r"unknown model 'fluxx'; did you mean flux\?.*models: flux, sana, sd3, tiny"):
        card("fluxx")
    with pytest.raises(ConfigError, match="did you mean sana"):
        build_adapter(ModelConfig(name="sanaa"))


@functools.cache
def _model_names_in(path: Path) -> list[str]:
    """Model names a module keeps a table of (dict keys or values) or branches on (compared with ``==`` / ``in``)."""
    names = set(cards())
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            candidates = [*node.keys, *node.values]
        elif isinstance(node, ast.Compare):
            candidates = [node.left, *node.comparators]
            candidates += [e for c in node.comparators if isinstance(c, (ast.Tuple, ast.List, ast.Set)) for e in c.elts]
        else:
            continue
        found |= {c.value for c in candidates if isinstance(c, ast.Constant) and c.value in names}
    return sorted(found)


@pytest.mark.parametrize("module", ["models/__init__.py", "models/flops.py", "models/model_files.py",
                                    "models/activations.py", "measure/activation_probe.py", "measure/published.py",
                                    "doctor/weights.py", "doctor/memory.py", "models/diffusers_common.py",
                                    "provenance/settings.py"])
def test_generic_modules_name_no_model(module):
    """Catches: a per-model table or branch coming back into a generic module (``if model == "sd3"``, a dict
    keyed by model names), so that adding a model means editing it again instead of writing the model's card."""
    assert _model_names_in(ROOT / module) == []
