"""The three models of the paper's Table 5 as the cost projection needs them: closed-form FLOPs of one forward,
split by what an FP4 recipe quantizes, and each model's settings from its real spec.

The report prices these (solbench/report/cost.py) and must not compute them (it reads stored results alone), so
they are computed here, once, and written to ``solbench/assets/paper_model_facts.json`` (``python -m
solbench.measure.paper_models`` rewrites it; tests/test_cost_projection.py fails when it is out of step with this code).
``solbench collect`` copies it into each results folder as ``paper_model_facts.parquet``, so a report of those
results gives the same projection whatever the code does later.

FLOPs per transformer forward (one image), counted as 2 x multiply-adds of the matrix products, the
convention of ``solbench.models.flops`` (which counts them with PyTorch's FlopCounterMode on the meta
device). Here they are derived in closed form from the same architecture configs
(``solbench.models.flops.REAL_MODELS``) so that they split into

- ``linear``: projections, MLPs, embedders, modulation and output layers (the layers an NVFP4
  recipe quantizes), and
- ``attention``: the activation-activation products Q K^T and A V (kept in BF16 by every FP4 recipe),

and need neither diffusers nor a forward pass. With d the width, L_i image tokens, L_t text
tokens, L = L_i + L_t:

- FLUX.1 (MM-DiT + single-stream DiT): each of the 19 double blocks and 38 single blocks costs
  12 d^2 L (QKV 3 d^2, output d^2, MLP 8 d^2 per token) + 2 L^2 d (attention); plus modulation
  (6 d^2 per stream per double block, 3 d^2 per single block, per image), embedders and output layer.
- SD3.5-Large (MM-DiT, 38 blocks): the same per-block structure; the last block is context-pre-only
  (no text output projection, no text MLP, a 2 d^2 modulation).
- SANA (linear DiT, 20 blocks): linear self-attention 4 d^2 L_i + 2 L_i d (h + 1) (h the head
  width: ReLU linear attention with the ones-padded value trick), cross-attention
  2 d^2 L_i + 2 d^2 L_t + 2 L_i L_t d, Mix-FFN (GLU with a 3x3 depthwise conv) with hidden
  width m = 2.5 d: 2 m d + 9 * 2 m + m d per token.
The tests check these against ``solbench.models.flops`` (FlopCounterMode) to better than 0.5 %.

Text tokens are the ones each real spec encodes (``model.text_max_length``: FLUX 128, SD3.5-L 77 + 128,
SANA 300), not the pipelines' maxima: an H200 measured FLUX's 512 px forward at the 128-token count
(docs/measured/H200.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

from solbench.results.stored_facts import (FACTS_SCHEMA, PAPER_MODEL_ASSET, ForwardFlops, ModelSetting,
                                           paper_model_row)

#: The real spec whose Sol-RL run each projected model prices (experiments/ of the repository).
PAPER_SPECS = {"flux": "flux_main.yaml", "sd3": "sd35_main.yaml", "sana": "sana_main.yaml"}

#: The repository's experiments/ folder, where the real specs live.
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"

#: The committed facts of the three models (``write_asset``), which collect copies into results.
ASSET = PAPER_MODEL_ASSET

#: ViT-H/14 at 224 px (HPSv2 and PickScore; 632 M parameters, 257 tokens): 2 x parameters x tokens.
REWARD_TFLOPS = 2 * 632e6 * 257 / 1e12

# FLUX: distilled guidance, one forward per step; SD3.5-L and SANA: two, FITTED (solbench/report/cost.py)
ROLLOUT_PASSES = {"flux": 1, "sd3": 2, "sana": 2}


def _flux(cfg: dict, image_tokens: int, text_tokens: int) -> ForwardFlops:
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    li, lt = image_tokens, text_tokens
    L = li + lt
    per_token = 12 * d * d
    macs_lin = (cfg["num_layers"] + cfg["num_single_layers"]) * per_token * L
    macs_lin += cfg["num_layers"] * 2 * 6 * d * d + cfg["num_single_layers"] * 3 * d * d  # modulation (per image)
    macs_lin += cfg["in_channels"] * d * li + cfg["joint_attention_dim"] * d * lt  # x / context embedders
    n_embeds = 3 if cfg.get("guidance_embeds") else 2  # timestep (+ guidance) + pooled text
    macs_lin += 2 * (256 * d + d * d) + (n_embeds - 2) * (256 * d + d * d) + (cfg["pooled_projection_dim"] * d + d * d)
    macs_lin += 2 * d * d + d * cfg["in_channels"] * li  # norm_out modulation, proj_out (out = in channels)
    macs_att = (cfg["num_layers"] + cfg["num_single_layers"]) * 2 * L * L * d
    return ForwardFlops(2.0 * macs_lin, 2.0 * macs_att)


def _sd3(cfg: dict, latent_hw: tuple[int, int], text_tokens: int) -> ForwardFlops:
    d = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    p = cfg["patch_size"]
    li = (latent_hw[0] // p) * (latent_hw[1] // p)
    lt = text_tokens
    L = li + lt
    n = cfg["num_layers"]
    patch_in = cfg["in_channels"] * p * p
    macs_lin = patch_in * d * li + cfg["joint_attention_dim"] * cfg["caption_projection_dim"] * lt
    macs_lin += (256 * d + d * d) + (cfg["pooled_projection_dim"] * d + d * d)  # timestep + pooled embed
    # image stream, every block: modulation 6 d^2, QKV 3 d^2, out d^2, MLP 8 d^2 per token
    macs_lin += n * (6 * d * d + 12 * d * d * li)
    # text stream: blocks 1..n-1 as the image stream; the last block only projects QKV (context_pre_only)
    macs_lin += (n - 1) * (6 * d * d + 12 * d * d * lt) + (2 * d * d + 3 * d * d * lt)
    macs_lin += 2 * d * d + d * p * p * cfg["out_channels"] * li  # norm_out, proj_out
    macs_att = n * 2 * L * L * d
    return ForwardFlops(2.0 * macs_lin, 2.0 * macs_att)


def _sana(cfg: dict, latent_hw: tuple[int, int], text_tokens: int) -> ForwardFlops:
    h = cfg["attention_head_dim"]
    d = cfg["num_attention_heads"] * h
    dc = cfg["num_cross_attention_heads"] * cfg["cross_attention_head_dim"]
    p = cfg.get("patch_size", 1)
    li = (latent_hw[0] // p) * (latent_hw[1] // p)
    lt = text_tokens
    m = int(cfg.get("mlp_ratio", 2.5) * d)
    n = cfg["num_layers"]
    macs_lin = cfg["in_channels"] * p * p * d * li  # patch embed
    macs_lin += (cfg["caption_channels"] * d + d * d) * lt  # caption projection
    macs_lin += (256 * d + d * d) + 6 * d * d  # timestep embedding + AdaLN-single modulation
    per_block_lin = 4 * d * d * li  # self-attention q, k, v, out
    per_block_lin += d * dc * li + 2 * cfg["cross_attention_dim"] * dc * lt + dc * d * li  # cross q, k, v, out
    per_block_lin += (2 * m * d + 9 * 2 * m + m * d) * li  # Mix-FFN: 1x1 inverted, 3x3 depthwise, 1x1 point
    macs_lin += n * per_block_lin
    macs_lin += d * p * p * cfg["out_channels"] * li  # proj_out
    # linear attention: (h+1) x h state per head from K, V, then applied to Q; cross-attention is softmax
    macs_att = n * (2 * li * d * (h + 1) + 2 * li * lt * dc)
    return ForwardFlops(2.0 * macs_lin, 2.0 * macs_att)


def forward_flops(model: str, resolution: int | None = None, recipe: str | None = None,
                  text_tokens: int | None = None) -> ForwardFlops:
    """Closed-form FLOPs of one forward of a real model (``flux`` | ``sd3`` | ``sana``) for one image, with
    the part ``recipe`` quantizes (default: the recipe of the model's real spec, ``spec_settings``) counted
    layer by layer by ``solbench.models.shares.precision_split`` on TransformerEngine's backend.
    ``text_tokens``: the text tokens the transformer attends to (default: the real spec's, ``spec_settings``;
    FLUX's 128, not the pipeline's 512: measured on an H200, docs/measured/H200.md)."""
    from solbench.errors import ConfigError
    from solbench.models.flops import REAL_MODELS
    from solbench.models.shares import precision_split

    if model not in REAL_MODELS:
        raise ConfigError(f"no architecture config for model {model!r}; known: {', '.join(REAL_MODELS)}")
    spec = REAL_MODELS[model]
    h, w = spec.latent_hw(resolution)
    lt = spec_settings(model)["text_tokens"] if text_tokens is None else int(text_tokens)
    if spec.class_name == "FluxTransformer2DModel":
        f = _flux(spec.config, (h // spec.pack) * (w // spec.pack), lt)
    elif spec.class_name == "SD3Transformer2DModel":
        f = _sd3(spec.config, (h, w), lt)
    else:
        f = _sana(spec.config, (h, w), lt)
    split = precision_split(model, recipe or spec_settings(model)["recipe"], resolution=resolution, backend="te",
                            text_tokens=lt)
    return ForwardFlops(f.linear, f.attention, split.quantized)


def _text_tflops(model: str, length: int) -> float:
    """2 x parameters x tokens of the text encoders, per prompt; ``length``: the spec's T5 / Gemma tokens."""
    if model == "flux":
        return 2 * (4.76e9 * length + 123e6 * 77) / 1e12  # T5-XXL (4.76 B) + CLIP-L (123 M, 77 tokens)
    if model == "sd3":
        return 2 * (4.76e9 * length + (123e6 + 695e6) * 77) / 1e12  # T5-XXL, CLIP-L and CLIP-G (695 M, 77)
    return 2 * 2.6e9 * length / 1e12  # SANA: Gemma-2-2B (2.6 B)


@functools.lru_cache(maxsize=None)
def spec_settings(model: str, experiments: Path = EXPERIMENTS) -> dict:
    """Resolution, text length, explore recipe, sampling steps and trained timesteps of the Sol-RL run of
    ``model``'s real spec (``PAPER_SPECS`` in ``experiments``), resolved as `solbench run` resolves it."""
    from solbench.models.activations import transformer_text_tokens
    from solbench.errors import ConfigError
    from solbench.methods.diffusion_nft import trained_timesteps
    from solbench.models import TEXT_MAX_LENGTH
    from solbench.spec import load_spec

    path = Path(experiments) / PAPER_SPECS[model]
    if not path.is_file():
        raise ConfigError(f"cost projection of {model!r}: no real spec {path} (the projection reads the "
                          "resolution, recipe and trained timesteps of its Sol-RL run)")
    runs = [r.config for r in load_spec(path).runs if r.config.method == "sol_rl"]
    if not runs:
        raise ConfigError(f"{path}: no sol_rl run to read the projection's settings from")
    cfg = runs[0]
    fraction = float(cfg.method_config["timestep_fraction"])
    length = int(cfg.model.text_max_length or TEXT_MAX_LENGTH[model])
    return {"spec": str(path.name), "model": cfg.model.name, "resolution": int(cfg.model.resolution),
            "recipe": cfg.quant.recipe, "text_max_length": length,
            "text_tokens": transformer_text_tokens(model, length),
            "steps": int(cfg.sampling.steps), "timestep_fraction": fraction,
            "train_timesteps": trained_timesteps(int(cfg.sampling.steps), fraction)}


@functools.lru_cache(maxsize=None)
def model_setting(model: str, **changes) -> ModelSetting:
    """The ModelSetting of ``model`` (flux | sd3 | sana): spec-derived values plus the sourced constants, and
    its forward's FLOPs. ``changes`` replace settings (resolution, rollout_passes, train_timesteps, ...) before
    the FLOPs are counted, so a changed resolution is a changed forward."""
    from solbench.models.flops import vae_decode_flops

    spec = spec_settings(model)
    setting = ModelSetting(resolution=spec["resolution"], rollout_passes=ROLLOUT_PASSES[model],
                           train_timesteps=spec["train_timesteps"],
                           text_tflops=_text_tflops(model, spec["text_max_length"]), text_tokens=spec["text_tokens"],
                           vae_tflops=vae_decode_flops(model, spec["resolution"]) / 1e12,
                           reward_tflops=REWARD_TFLOPS, recipe=spec["recipe"])
    setting = dataclasses.replace(setting, **changes)
    return dataclasses.replace(setting, flops=forward_flops(model, setting.resolution, setting.recipe or None,
                                                            setting.text_tokens))


def paper_models() -> dict[str, ModelSetting]:
    """{model: ModelSetting} of the three models of Table 5, computed from this code and the real specs."""
    return {model: model_setting(model) for model in PAPER_SPECS}


def facts_rows() -> list[dict]:
    """The paper-model facts table's rows (solbench.results.stored_facts.paper_model_row), with each model's real spec."""
    return [paper_model_row(model, setting, spec=PAPER_SPECS[model]) for model, setting in paper_models().items()]


def write_asset(path: Path = ASSET) -> Path:
    """Write the committed facts (``ASSET``) from this code and the real specs."""
    data = {"facts_schema": FACTS_SCHEMA, "source": "python -m solbench.measure.paper_models", "models": facts_rows()}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":  # pragma: no cover - the asset's writer
    print(write_asset())
