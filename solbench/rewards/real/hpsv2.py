"""HPSv2.1: the HPS-tuned open_clip ViT-H/14, converted to a transformers CLIPModel on load (so neither
open_clip nor hpsv2 is needed), and the open_clip -> transformers checkpoint conversion."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from solbench.models.hub import load_state_dict_file, resolve_file
from solbench.rewards.real.clip import CLIPPreferenceReward
from solbench.rewards.real.sources import HPS_FILE, HPS_REPO, LAION_H14


def _count_layers(keys: Sequence[str], prefix: str) -> int:
    pat = re.compile(re.escape(prefix) + r"(\d+)\.")
    idx = {int(m.group(1)) for k in keys if (m := pat.match(k))}
    if not idx:
        raise ValueError(f"no transformer blocks under {prefix!r} in the checkpoint")
    if idx != set(range(len(idx))):
        raise ValueError(f"non-contiguous block indices under {prefix!r}: {sorted(idx)}")
    return len(idx)


def convert_open_clip_state_dict(sd: Mapping[str, Tensor], *, vision_heads: int = 16, text_heads: int = 16):
    """Convert an open_clip ``CLIP`` (ViT, built-in text tower) state dict to transformers CLIPModel.

    Returns ``(CLIPConfig, state_dict)``. Dimensions come from the tensors; head counts cannot be
    read from shapes, so they are arguments (open_clip ViT-H-14: 16 and 16, i.e. head widths 80 and
    64). The text tower pools at the argmax token id like open_clip (``eos_token_id=2``, the
    transformers convention for that). Raises ValueError on a layout it does not know.
    """
    from transformers import CLIPConfig

    sd = {re.sub(r"^module\.", "", k): v for k, v in sd.items()}
    keys = list(sd)
    needed = ["visual.conv1.weight", "visual.class_embedding", "visual.positional_embedding", "visual.ln_pre.weight",
              "visual.ln_post.weight", "visual.proj", "token_embedding.weight", "positional_embedding",
              "ln_final.weight", "text_projection", "logit_scale"]
    absent = [k for k in needed if k not in sd]
    if absent:
        raise ValueError(f"not an open_clip ViT CLIP state dict: missing {absent[:5]}")
    v_width, _, patch, _ = sd["visual.conv1.weight"].shape
    n_pos = sd["visual.positional_embedding"].shape[0]
    grid = int(round(math.sqrt(n_pos - 1)))
    if grid * grid + 1 != n_pos:
        raise ValueError(f"visual.positional_embedding has {n_pos} rows, not grid^2 + 1")
    v_layers = _count_layers(keys, "visual.transformer.resblocks.")
    t_layers = _count_layers(keys, "transformer.resblocks.")
    v_mlp = sd["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]
    t_mlp = sd["transformer.resblocks.0.mlp.c_fc.weight"].shape[0]
    vocab, t_width = sd["token_embedding.weight"].shape
    context = sd["positional_embedding"].shape[0]
    embed_dim = sd["text_projection"].shape[1]
    if sd["visual.proj"].shape != (v_width, embed_dim):
        raise ValueError(f"visual.proj {tuple(sd['visual.proj'].shape)} != ({v_width}, {embed_dim})")
    for width, heads, tower in ((v_width, vision_heads, "vision"), (t_width, text_heads, "text")):
        if width % heads:
            raise ValueError(f"{tower} width {width} is not divisible by {heads} heads")

    config = CLIPConfig(
        text_config=dict(vocab_size=vocab, hidden_size=t_width, intermediate_size=t_mlp, num_hidden_layers=t_layers,
                         num_attention_heads=text_heads, max_position_embeddings=context, hidden_act="gelu",
                         layer_norm_eps=1e-5, projection_dim=embed_dim, eos_token_id=2, bos_token_id=0, pad_token_id=1),
        vision_config=dict(hidden_size=v_width, intermediate_size=v_mlp, num_hidden_layers=v_layers,
                           num_attention_heads=vision_heads, image_size=grid * patch, patch_size=patch,
                           hidden_act="gelu", layer_norm_eps=1e-5, projection_dim=embed_dim),
        projection_dim=embed_dim,
    )

    out: dict[str, Tensor] = {}

    def blocks(src: str, dst: str, n: int) -> None:
        for i in range(n):
            s, d = f"{src}{i}.", f"{dst}{i}."
            q, k, v = sd[s + "attn.in_proj_weight"].chunk(3, dim=0)
            qb, kb, vb = sd[s + "attn.in_proj_bias"].chunk(3, dim=0)
            out.update({
                d + "self_attn.q_proj.weight": q, d + "self_attn.q_proj.bias": qb,
                d + "self_attn.k_proj.weight": k, d + "self_attn.k_proj.bias": kb,
                d + "self_attn.v_proj.weight": v, d + "self_attn.v_proj.bias": vb,
                d + "self_attn.out_proj.weight": sd[s + "attn.out_proj.weight"],
                d + "self_attn.out_proj.bias": sd[s + "attn.out_proj.bias"],
                d + "layer_norm1.weight": sd[s + "ln_1.weight"], d + "layer_norm1.bias": sd[s + "ln_1.bias"],
                d + "layer_norm2.weight": sd[s + "ln_2.weight"], d + "layer_norm2.bias": sd[s + "ln_2.bias"],
                d + "mlp.fc1.weight": sd[s + "mlp.c_fc.weight"], d + "mlp.fc1.bias": sd[s + "mlp.c_fc.bias"],
                d + "mlp.fc2.weight": sd[s + "mlp.c_proj.weight"], d + "mlp.fc2.bias": sd[s + "mlp.c_proj.bias"],
            })

    blocks("visual.transformer.resblocks.", "vision_model.encoder.layers.", v_layers)
    blocks("transformer.resblocks.", "text_model.encoder.layers.", t_layers)
    out.update({
        "vision_model.embeddings.class_embedding": sd["visual.class_embedding"],
        "vision_model.embeddings.patch_embedding.weight": sd["visual.conv1.weight"],
        "vision_model.embeddings.position_embedding.weight": sd["visual.positional_embedding"],
        "vision_model.pre_layrnorm.weight": sd["visual.ln_pre.weight"],
        "vision_model.pre_layrnorm.bias": sd["visual.ln_pre.bias"],
        "vision_model.post_layernorm.weight": sd["visual.ln_post.weight"],
        "vision_model.post_layernorm.bias": sd["visual.ln_post.bias"],
        "visual_projection.weight": sd["visual.proj"].t().contiguous(),
        "text_model.embeddings.token_embedding.weight": sd["token_embedding.weight"],
        "text_model.embeddings.position_embedding.weight": sd["positional_embedding"],
        "text_model.final_layer_norm.weight": sd["ln_final.weight"],
        "text_model.final_layer_norm.bias": sd["ln_final.bias"],
        "text_projection.weight": sd["text_projection"].t().contiguous(),
        "logit_scale": sd["logit_scale"].reshape(()),
    })
    return config, out


def load_open_clip_as_clip_model(sd: Mapping[str, Tensor], **heads) -> nn.Module:
    """Build a transformers CLIPModel holding an open_clip state dict (strict: every weight used)."""
    from transformers import CLIPModel

    config, hf_sd = convert_open_clip_state_dict(sd, **heads)
    with torch.device("meta"):
        model = CLIPModel(config)
    missing, unexpected = model.load_state_dict(hf_sd, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"open_clip conversion mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, buf in list(model.named_buffers()):
        if buf.is_meta and name.endswith("position_ids"):
            mod = model.get_submodule(name.rsplit(".", 1)[0])
            mod.position_ids = torch.arange(buf.shape[-1]).expand(1, -1)
    return model.eval()


class HPSv2Reward(CLIPPreferenceReward):
    """HPSv2.1 (Wu et al. 2023): ``cos(img, txt)`` of the HPS-tuned open_clip ViT-H/14, as hpsv2.score().

    The open_clip checkpoint (xswu/HPSv2 HPS_v2.1_compressed.pt, the full model state dict) is
    converted to a transformers CLIPModel on load, so neither open_clip nor hpsv2 is needed. The
    tokenizer is the laion CLIP-ViT-H-14 one (the same BPE as open_clip's). hpsv2 scores under CUDA
    autocast (fp16); pass ``dtype="float16"`` to mirror that, float32 (default) for the exact value.
    """

    name = "hpsv2"
    range = (0.0, 0.5)  # typical span of the cosine; the exact bound is [-1, 1]

    def __init__(self, *, checkpoint: str = HPS_REPO, filename: str = HPS_FILE, tokenizer_id: str = LAION_H14,
                 vision_heads: int = 16, text_heads: int = 16, **kw) -> None:
        kw.setdefault("model_id", checkpoint)
        super().__init__(tokenizer_id=tokenizer_id, scale=1.0, **kw)
        self.checkpoint, self.filename = checkpoint, filename
        self.heads = dict(vision_heads=vision_heads, text_heads=text_heads)

    def _load_model(self) -> nn.Module:
        path = resolve_file(self.checkpoint, self.filename, what="hpsv2 reward checkpoint", include=(self.filename,))
        return load_open_clip_as_clip_model(load_state_dict_file(path), **self.heads)
