"""ImageReward v1.0 on transformers' BLIP components: configs, the model, the checkpoint conversion,
the tokenizer with BLIP's special tokens, and the reward (the image-reward package does not import
under transformers 5)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from solbench.models.hub import from_pretrained_local, load_state_dict_file, resolve_file
from solbench.rewards.real.base import ModelReward
from solbench.rewards.real.preprocess import clip_preprocess
from solbench.rewards.real.sources import BERT_BASE, IMAGEREWARD_FILE, IMAGEREWARD_MED_CONFIG, IMAGEREWARD_REPO, WEIGHTS

IMAGEREWARD_MEAN = 0.16717362830052426
IMAGEREWARD_STD = 1.0333394966054072
IMAGEREWARD_MAX_TOKENS = 35


def imagereward_vision_config(**overrides):
    """BLIP 'large' ViT of ImageReward (ViT-L/16 at 224 px, LayerNorm eps 1e-6 as BLIP's vit.py)."""
    from transformers import BlipVisionConfig

    cfg = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
               image_size=224, patch_size=16, hidden_act="gelu", layer_norm_eps=1e-6)
    cfg.update(overrides)
    return BlipVisionConfig(**cfg)


def imagereward_text_config(med_config: Mapping[str, Any] | None = None, *, encoder_hidden_size: int = 1024, **overrides):
    """BlipTextConfig equivalent to BLIP's med_config.json (BERT-base with cross-attention)."""
    from transformers import BlipTextConfig

    med = dict(med_config or {})
    cfg = dict(
        vocab_size=med.get("vocab_size", 30524), hidden_size=med.get("hidden_size", 768),
        intermediate_size=med.get("intermediate_size", 3072), num_hidden_layers=med.get("num_hidden_layers", 12),
        num_attention_heads=med.get("num_attention_heads", 12), hidden_act=med.get("hidden_act", "gelu"),
        layer_norm_eps=med.get("layer_norm_eps", 1e-12), max_position_embeddings=med.get("max_position_embeddings", 512),
        pad_token_id=med.get("pad_token_id", 0), encoder_hidden_size=encoder_hidden_size,
        is_decoder=True,  # transformers builds the cross-attention blocks only for is_decoder configs
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )
    cfg.update(overrides)
    return BlipTextConfig(**cfg)


class ImageRewardModel(nn.Module):
    """ImageReward v1.0 on transformers modules: BLIP ViT + BLIP text encoder + MLP head.

    ``forward(pixel_values, input_ids, attention_mask) -> [B]`` standardised rewards, exactly
    ImageReward.score(): the prompt's [CLS] state after cross-attending to all image tokens, through
    the 5-layer linear head (no activations, as in the package), minus ``mean``, over ``std``.
    """

    def __init__(self, vision_config, text_config) -> None:
        super().__init__()
        from transformers import BlipTextModel, BlipVisionModel

        self.vision_model = BlipVisionModel(vision_config)
        self.text_encoder = BlipTextModel(text_config, add_pooling_layer=False)
        h = text_config.hidden_size
        self.mlp = nn.Module()
        self.mlp.layers = nn.Sequential(  # indices match ImageReward's MLP (dropouts at 1, 3, 5)
            nn.Linear(h, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )
        # Plain floats, not buffers: model.to(bfloat16) must not round the package's constants.
        self.mean, self.std = IMAGEREWARD_MEAN, IMAGEREWARD_STD

    def features(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        image_embeds = self.vision_model(pixel_values=pixel_values).last_hidden_state
        image_atts = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        text = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                 encoder_hidden_states=image_embeds, encoder_attention_mask=image_atts)
        return text.last_hidden_state[:, 0, :]

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        feats = self.features(pixel_values, input_ids, attention_mask).float()
        raw = self.mlp.layers(feats.to(self.mlp.layers[0].weight.dtype)).float().squeeze(-1)
        return (raw - self.mean) / self.std


_IR_VISION_MAP = [
    (r"^blip\.visual_encoder\.cls_token$", "vision_model.embeddings.class_embedding"),
    (r"^blip\.visual_encoder\.pos_embed$", "vision_model.embeddings.position_embedding"),
    (r"^blip\.visual_encoder\.patch_embed\.proj\.", "vision_model.embeddings.patch_embedding."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm1\.", r"vision_model.encoder.layers.\1.layer_norm1."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.norm2\.", r"vision_model.encoder.layers.\1.layer_norm2."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.qkv\.", r"vision_model.encoder.layers.\1.self_attn.qkv."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.attn\.proj\.", r"vision_model.encoder.layers.\1.self_attn.projection."),
    (r"^blip\.visual_encoder\.blocks\.(\d+)\.mlp\.fc([12])\.", r"vision_model.encoder.layers.\1.mlp.fc\2."),
    (r"^blip\.visual_encoder\.norm\.", "vision_model.post_layernorm."),
    (r"^blip\.text_encoder\.", "text_encoder."),
    (r"^mlp\.layers\.", "mlp.layers."),
]
# Parts of BLIP_Pretrain that ImageReward.score() never uses.
_IR_UNUSED = re.compile(r"^blip\.(vision_proj|text_proj|itm_head|temp|.*queue|.*_m\.|visual_encoder_m|text_encoder_m)"
                        r"|position_ids$|^blip\.text_encoder\.pooler\.")


def convert_imagereward_state_dict(sd: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Rename ImageReward.pt keys (BLIP timm-ViT + med.py BERT + MLP) to :class:`ImageRewardModel`'s.

    Unused BLIP_Pretrain parts (projections, ITM head, momentum encoders, queues) are dropped; any
    other unknown key raises ValueError rather than being silently ignored.
    """
    out: dict[str, Tensor] = {}
    unknown = []
    for key, value in sd.items():
        key = re.sub(r"^module\.", "", key)
        # The drop rule sees the checkpoint's own key, before any renaming: med.py saves its
        # position_ids buffer (blip.text_encoder.embeddings.position_ids), which the text-encoder
        # rename below would otherwise carry into the model as an unexpected key.
        if _IR_UNUSED.search(key):
            continue
        for pat, repl in _IR_VISION_MAP:
            if re.search(pat, key):
                out[re.sub(pat, repl, key)] = value
                break
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"unexpected keys in the ImageReward checkpoint: {unknown[:8]}")
    return out


def build_imagereward_tokenizer(source: str = BERT_BASE) -> Any:
    """bert-base-uncased with BLIP's added [DEC] (bos) and [ENC] tokens, as BLIP's init_tokenizer()."""
    from transformers import BertTokenizer

    tok = from_pretrained_local(BertTokenizer.from_pretrained, source, what="imagereward tokenizer",
                           include=WEIGHTS["imagereward"][1].include)
    return add_blip_special_tokens(tok)


def add_blip_special_tokens(tok: Any) -> Any:
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tok


class ImageRewardReward(ModelReward):
    """ImageReward v1.0 (Xu et al. 2023) reimplemented on transformers' BLIP modules.

    Reproduces ImageReward.score(prompt, image): BERT tokens padded to 35, CLIP-normalised 224 px
    image, [CLS] state of the cross-attending text encoder, linear head, standardised by the
    package's mean/std. Weights: THUDM/ImageReward (ImageReward.pt, med_config.json) plus the
    bert-base-uncased tokenizer. The image-reward package itself does not import under transformers 5.
    """

    name = "imagereward"
    range = (-2.5, 2.5)  # standardised score; typical span, not a bound

    def __init__(self, *, checkpoint: str = IMAGEREWARD_REPO, filename: str = IMAGEREWARD_FILE,
                 med_config: str = IMAGEREWARD_MED_CONFIG, tokenizer_id: str = BERT_BASE,
                 model: ImageRewardModel | None = None, tokenizer: Any = None,
                 vision_config: Mapping[str, Any] | None = None, **kw) -> None:
        super().__init__(**kw)
        self.checkpoint, self.filename, self.med_config = checkpoint, filename, med_config
        self.vision_overrides = dict(vision_config or {})  # only for non-standard (e.g. test) checkpoints
        self.tokenizer_id = tokenizer_id
        self.model, self.tokenizer = model, tokenizer

    def _load(self) -> None:
        import json

        if self.model is None:
            include = (self.filename, self.med_config)
            ckpt = resolve_file(self.checkpoint, self.filename, what="imagereward checkpoint", include=include)
            med = json.loads(resolve_file(self.checkpoint, self.med_config, what="imagereward med_config",
                                          include=include).read_text())
            sd = convert_imagereward_state_dict(load_state_dict_file(ckpt))
            vision_cfg = imagereward_vision_config(**self.vision_overrides)
            model = ImageRewardModel(vision_cfg, imagereward_text_config(med, encoder_hidden_size=vision_cfg.hidden_size))
            missing, unexpected = model.load_state_dict(sd, strict=False)
            missing = [k for k in missing if not k.endswith("position_ids")]
            if missing or unexpected:
                raise ValueError(f"ImageReward checkpoint does not fit: missing {missing[:5]}, unexpected {unexpected[:5]}")
            self.model = model
        if self.tokenizer is None:
            self.tokenizer = build_imagereward_tokenizer(self.tokenizer_id)
        self.model = self.model.to(device=self.device, dtype=self.dtype).eval().requires_grad_(False)
        self.image_size = int(self.model.vision_model.config.image_size)

    def _score(self, images: Tensor, prompts: list[str]) -> Tensor:
        pixels = clip_preprocess(images, self.image_size).to(self.dtype)
        tok = self.tokenizer(prompts, padding="max_length", truncation=True, max_length=IMAGEREWARD_MAX_TOKENS,
                             return_tensors="pt")
        return self.model(pixels, tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device))
