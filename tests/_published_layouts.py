"""Checkpoints laid out like the real published reward files, at toy sizes.

Each builder writes the keys (names, shapes, dtypes, buffers included) of the file users download,
transcribed from the code that saved that file, never from the class solbench loads it into, so
a test fails when the loader does not accept the real layout. docs/real-models.md lists the same
layouts ("Reward checkpoint layouts").

- ImageReward.pt (THUDM/ImageReward): ``torch.save(ImageReward.state_dict())`` of ImageReward.py:
  ``blip.*`` is ImageReward's BLIP_Pretrain (BLIP vit.py VisionTransformer, med.py BertModel with
  add_pooling_layer=False whose BertEmbeddings registers a *persistent* ``position_ids`` buffer,
  vision_proj, text_proj), ``mlp.layers.{0,2,4,6,7}`` the MLP head (dropouts at 1, 3, 5).
- HPS_v2.1_compressed.pt (xswu/HPSv2): ``{"state_dict": open_clip CLIP ViT-H-14 state dict}``
  (open_clip registers ``attn_mask`` with persistent=False, so it is absent).
- PickScore_v1 / openai clip-vit-large-patch14: a transformers CLIPModel saved by transformers
  < 4.31, whose CLIP embeddings still saved ``position_ids`` (int64 [1, n]) in the file.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F


def _fill(layout: "OrderedDict[str, tuple]", seed: int) -> "OrderedDict[str, torch.Tensor]":
    """Random tensors for a layout of name -> shape; LayerNorm weights near 1, position_ids = arange."""
    g = torch.Generator().manual_seed(seed)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, shape in layout.items():
        if name.endswith("position_ids"):
            out[name] = torch.arange(shape[-1], dtype=torch.long).expand(*shape).clone()
        elif name == "logit_scale":
            out[name] = torch.tensor(math.log(100.0))
        else:
            t = 0.2 * torch.randn(*shape, generator=g)
            norm = any(s in name for s in ("norm", "LayerNorm", "ln_", "layer_norm", "layrnorm"))
            if norm and name.endswith("weight"):
                t = 1.0 + 0.5 * t
            out[name] = t
    return out


# ------------------------------------------------------------------------------------------------
# ImageReward.pt
# ------------------------------------------------------------------------------------------------


def imagereward_layout(*, width=32, depth=2, mlp=64, patch=8, image_size=32, hidden=24, layers=2, inter=48,
                       vocab=40, max_pos=64, embed_dim=16) -> "OrderedDict[str, tuple]":
    """Keys and shapes of ImageReward.pt (real: width 1024, depth 24, mlp 4096, patch 16, 224 px;
    hidden 768, 12 layers, 3072, vocab 30524, 512 positions; embed_dim 256)."""
    L: OrderedDict[str, tuple] = OrderedDict()
    v = "blip.visual_encoder."
    n_tok = (image_size // patch) ** 2 + 1
    L[v + "cls_token"] = (1, 1, width)
    L[v + "pos_embed"] = (1, n_tok, width)
    L[v + "patch_embed.proj.weight"] = (width, 3, patch, patch)
    L[v + "patch_embed.proj.bias"] = (width,)
    for i in range(depth):
        b = f"{v}blocks.{i}."
        L[b + "norm1.weight"] = L[b + "norm1.bias"] = (width,)
        L[b + "attn.qkv.weight"], L[b + "attn.qkv.bias"] = (3 * width, width), (3 * width,)
        L[b + "attn.proj.weight"], L[b + "attn.proj.bias"] = (width, width), (width,)
        L[b + "norm2.weight"] = L[b + "norm2.bias"] = (width,)
        L[b + "mlp.fc1.weight"], L[b + "mlp.fc1.bias"] = (mlp, width), (mlp,)
        L[b + "mlp.fc2.weight"], L[b + "mlp.fc2.bias"] = (width, mlp), (width,)
    L[v + "norm.weight"] = L[v + "norm.bias"] = (width,)
    t = "blip.text_encoder."
    L[t + "embeddings.position_ids"] = (1, max_pos)  # med.py BertEmbeddings: a persistent buffer
    L[t + "embeddings.word_embeddings.weight"] = (vocab, hidden)
    L[t + "embeddings.position_embeddings.weight"] = (max_pos, hidden)
    L[t + "embeddings.LayerNorm.weight"] = L[t + "embeddings.LayerNorm.bias"] = (hidden,)
    for i in range(layers):
        b = f"{t}encoder.layer.{i}."
        for att, kv_width in (("attention", hidden), ("crossattention", width)):
            L[f"{b}{att}.self.query.weight"], L[f"{b}{att}.self.query.bias"] = (hidden, hidden), (hidden,)
            L[f"{b}{att}.self.key.weight"], L[f"{b}{att}.self.key.bias"] = (hidden, kv_width), (hidden,)
            L[f"{b}{att}.self.value.weight"], L[f"{b}{att}.self.value.bias"] = (hidden, kv_width), (hidden,)
            L[f"{b}{att}.output.dense.weight"], L[f"{b}{att}.output.dense.bias"] = (hidden, hidden), (hidden,)
            L[f"{b}{att}.output.LayerNorm.weight"] = L[f"{b}{att}.output.LayerNorm.bias"] = (hidden,)
        L[b + "intermediate.dense.weight"], L[b + "intermediate.dense.bias"] = (inter, hidden), (inter,)
        L[b + "output.dense.weight"], L[b + "output.dense.bias"] = (hidden, inter), (hidden,)
        L[b + "output.LayerNorm.weight"] = L[b + "output.LayerNorm.bias"] = (hidden,)
    L["blip.vision_proj.weight"], L["blip.vision_proj.bias"] = (embed_dim, width), (embed_dim,)
    L["blip.text_proj.weight"], L["blip.text_proj.bias"] = (embed_dim, hidden), (embed_dim,)
    dims = [hidden, 1024, 128, 64, 16, 1]
    for idx, (a, b_) in zip((0, 2, 4, 6, 7), zip(dims[:-1], dims[1:])):
        L[f"mlp.layers.{idx}.weight"], L[f"mlp.layers.{idx}.bias"] = (b_, a), (b_,)
    return L


def imagereward_checkpoint(seed: int = 4, **dims) -> "OrderedDict[str, torch.Tensor]":
    sd = _fill(imagereward_layout(**dims), seed)
    hidden = imagereward_layout(**dims)["mlp.layers.0.weight"][1]
    for idx, fan_in in zip((0, 2, 4, 6, 7), (hidden, 1024, 128, 64, 16)):  # a head whose output varies
        sd[f"mlp.layers.{idx}.weight"] = sd[f"mlp.layers.{idx}.weight"] * 25 / math.sqrt(fan_in)
    return sd


def med_config(*, hidden=24, layers=2, inter=48, vocab=40, max_pos=64, heads=4, encoder_width=32) -> dict:
    """ImageReward's med_config.json (real: 768, 12, 3072, 30524, 512, 12 heads, encoder_width 768)."""
    return {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1, "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": inter,
            "layer_norm_eps": 1e-12, "max_position_embeddings": max_pos, "model_type": "bert",
            "num_attention_heads": heads, "num_hidden_layers": layers, "pad_token_id": 0, "type_vocab_size": 2,
            "vocab_size": vocab, "encoder_width": encoder_width, "add_cross_attention": True}


def blip_vit_forward(sd, pixels, *, heads, patch, eps=1e-6):
    """BLIP vit.py VisionTransformer.forward, from ImageReward.pt's parameter names."""
    p = lambda k: sd["blip.visual_encoder." + k]  # noqa: E731
    x = F.conv2d(pixels, p("patch_embed.proj.weight"), p("patch_embed.proj.bias"), stride=patch).flatten(2).transpose(1, 2)
    x = torch.cat([p("cls_token").expand(x.shape[0], -1, -1), x], dim=1) + p("pos_embed")[:, : x.shape[1] + 1]
    width, i = x.shape[-1], 0
    while f"blip.visual_encoder.blocks.{i}.norm1.weight" in sd:
        b = f"blocks.{i}."
        y = F.layer_norm(x, (width,), p(b + "norm1.weight"), p(b + "norm1.bias"), eps)
        B, N, C = y.shape
        q, k, v = F.linear(y, p(b + "attn.qkv.weight"), p(b + "attn.qkv.bias")).reshape(
            B, N, 3, heads, C // heads).permute(2, 0, 3, 1, 4)
        y = (((q @ k.transpose(-2, -1)) * (C // heads) ** -0.5).softmax(-1) @ v).transpose(1, 2).reshape(B, N, C)
        x = x + F.linear(y, p(b + "attn.proj.weight"), p(b + "attn.proj.bias"))
        y = F.layer_norm(x, (width,), p(b + "norm2.weight"), p(b + "norm2.bias"), eps)
        x = x + F.linear(F.gelu(F.linear(y, p(b + "mlp.fc1.weight"), p(b + "mlp.fc1.bias"))),
                         p(b + "mlp.fc2.weight"), p(b + "mlp.fc2.bias"))
        i += 1
    return F.layer_norm(x, (width,), p("norm.weight"), p("norm.bias"), eps)


def med_text_forward(sd, input_ids, attention_mask, image_embeds, *, heads, eps=1e-12):
    """med.py BertModel.forward (mode 'multimodal', bidirectional) from ImageReward.pt's parameter names."""
    p = lambda k: sd["blip.text_encoder." + k]  # noqa: E731
    n = input_ids.shape[1]
    x = F.embedding(input_ids, p("embeddings.word_embeddings.weight"))
    x = x + F.embedding(p("embeddings.position_ids")[:, :n], p("embeddings.position_embeddings.weight"))
    h = x.shape[-1]
    ln = lambda t, k: F.layer_norm(t, (h,), p(k + ".weight"), p(k + ".bias"), eps)  # noqa: E731
    lin = lambda t, k: F.linear(t, p(k + ".weight"), p(k + ".bias"))  # noqa: E731
    x = ln(x, "embeddings.LayerNorm")
    self_mask = (1.0 - attention_mask[:, None, None, :].float()) * -10000.0

    def attend(q_in, kv_in, prefix, mask):
        B, dh = q_in.shape[0], h // heads
        split = lambda t: t.view(B, -1, heads, dh).permute(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(lin(q_in, prefix + ".self.query")), split(lin(kv_in, prefix + ".self.key")), split(
            lin(kv_in, prefix + ".self.value"))
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if mask is not None:
            scores = scores + mask
        ctx = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(B, -1, h)
        return ln(lin(ctx, prefix + ".output.dense") + q_in, prefix + ".output.LayerNorm")

    i = 0
    while f"blip.text_encoder.encoder.layer.{i}.attention.self.query.weight" in sd:
        b = f"encoder.layer.{i}."
        x = attend(x, x, b + "attention", self_mask)
        x = attend(x, image_embeds, b + "crossattention", None)  # image attention mask all ones
        x = ln(lin(F.gelu(lin(x, b + "intermediate.dense")), b + "output.dense") + x, b + "output.LayerNorm")
        i += 1
    return x


def imagereward_reference(sd, pixels, input_ids, attention_mask, *, v_heads, t_heads, patch):
    """ImageReward.score() from the checkpoint alone: BLIP ViT, med.py text encoder, MLP, standardise."""
    image_embeds = blip_vit_forward(sd, pixels, heads=v_heads, patch=patch)
    h = med_text_forward(sd, input_ids, attention_mask, image_embeds, heads=t_heads)[:, 0, :]
    for idx in (0, 2, 4, 6, 7):
        h = F.linear(h, sd[f"mlp.layers.{idx}.weight"], sd[f"mlp.layers.{idx}.bias"])
    return (h.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072


# ------------------------------------------------------------------------------------------------
# HPS_v2.1_compressed.pt: open_clip CLIP (ViT tower, built-in text tower)
# ------------------------------------------------------------------------------------------------


def open_clip_layout(*, v_width=48, v_layers=2, patch=8, image_size=32, t_width=32, t_layers=2, vocab=60,
                     context=77, embed_dim=16) -> "OrderedDict[str, tuple]":
    """Keys of open_clip's CLIP state dict (ViT-H-14: 1280 x 32, patch 14, 224 px; text 1024 x 24, 1024-d)."""
    L: OrderedDict[str, tuple] = OrderedDict()
    L["positional_embedding"] = (context, t_width)
    L["text_projection"] = (t_width, embed_dim)
    L["logit_scale"] = ()
    L["visual.class_embedding"] = (v_width,)
    L["visual.positional_embedding"] = ((image_size // patch) ** 2 + 1, v_width)
    L["visual.proj"] = (v_width, embed_dim)
    L["visual.conv1.weight"] = (v_width, 3, patch, patch)
    L["visual.ln_pre.weight"] = L["visual.ln_pre.bias"] = (v_width,)

    def blocks(prefix, width, n):
        for i in range(n):
            b = f"{prefix}transformer.resblocks.{i}."
            L[b + "ln_1.weight"] = L[b + "ln_1.bias"] = (width,)
            L[b + "attn.in_proj_weight"], L[b + "attn.in_proj_bias"] = (3 * width, width), (3 * width,)
            L[b + "attn.out_proj.weight"], L[b + "attn.out_proj.bias"] = (width, width), (width,)
            L[b + "ln_2.weight"] = L[b + "ln_2.bias"] = (width,)
            L[b + "mlp.c_fc.weight"], L[b + "mlp.c_fc.bias"] = (4 * width, width), (4 * width,)
            L[b + "mlp.c_proj.weight"], L[b + "mlp.c_proj.bias"] = (width, 4 * width), (width,)

    blocks("visual.", v_width, v_layers)
    L["visual.ln_post.weight"] = L["visual.ln_post.bias"] = (v_width,)
    blocks("", t_width, t_layers)
    L["token_embedding.weight"] = (vocab, t_width)
    L["ln_final.weight"] = L["ln_final.bias"] = (t_width,)
    return L


def hps_checkpoint(seed: int = 2, **dims) -> dict:
    """What ``torch.load('HPS_v2.1_compressed.pt')`` returns: {'state_dict': open_clip state dict}."""
    return {"state_dict": _fill(open_clip_layout(**dims), seed)}


# ------------------------------------------------------------------------------------------------
# PickScore_v1 / openai CLIP: a transformers CLIPModel directory saved by transformers < 4.31
# ------------------------------------------------------------------------------------------------


def hf_clip_layout(*, v_width=32, v_layers=2, patch=8, image_size=32, t_width=32, t_layers=2, vocab=60,
                   context=77, embed_dim=16, v_mlp=64, t_mlp=64) -> "OrderedDict[str, tuple]":
    """Keys of PickScore_v1 / clip-vit-large-patch14 model.safetensors (position_ids included)."""
    L: OrderedDict[str, tuple] = OrderedDict()
    L["logit_scale"] = ()
    L["text_model.embeddings.position_embedding.weight"] = (context, t_width)
    L["text_model.embeddings.position_ids"] = (1, context)
    L["text_model.embeddings.token_embedding.weight"] = (vocab, t_width)

    def layers(prefix, width, mlp, n):
        for i in range(n):
            b = f"{prefix}.encoder.layers.{i}."
            L[b + "layer_norm1.weight"] = L[b + "layer_norm1.bias"] = (width,)
            L[b + "layer_norm2.weight"] = L[b + "layer_norm2.bias"] = (width,)
            L[b + "mlp.fc1.weight"], L[b + "mlp.fc1.bias"] = (mlp, width), (mlp,)
            L[b + "mlp.fc2.weight"], L[b + "mlp.fc2.bias"] = (width, mlp), (width,)
            for proj in ("k_proj", "v_proj", "q_proj", "out_proj"):
                L[f"{b}self_attn.{proj}.weight"], L[f"{b}self_attn.{proj}.bias"] = (width, width), (width,)

    layers("text_model", t_width, t_mlp, t_layers)
    L["text_model.final_layer_norm.weight"] = L["text_model.final_layer_norm.bias"] = (t_width,)
    L["text_projection.weight"] = (embed_dim, t_width)
    n_pos = (image_size // patch) ** 2 + 1
    L["vision_model.embeddings.class_embedding"] = (v_width,)
    L["vision_model.embeddings.patch_embedding.weight"] = (v_width, 3, patch, patch)
    L["vision_model.embeddings.position_embedding.weight"] = (n_pos, v_width)
    L["vision_model.embeddings.position_ids"] = (1, n_pos)
    layers("vision_model", v_width, v_mlp, v_layers)
    L["vision_model.post_layernorm.weight"] = L["vision_model.post_layernorm.bias"] = (v_width,)
    L["vision_model.pre_layrnorm.weight"] = L["vision_model.pre_layrnorm.bias"] = (v_width,)
    L["visual_projection.weight"] = (embed_dim, v_width)
    return L


def write_hf_clip_dir(path: Path, tokenizer, *, seed: int = 1, heads: int = 4, hidden_act: str = "quick_gelu",
                      **dims) -> "OrderedDict[str, torch.Tensor]":
    """A CLIP repository directory as on the Hub: config.json (written out, as the Hub's), model.safetensors
    in the published key layout, and the tokenizer files. Returns the tensors written."""
    from safetensors.torch import save_file

    layout = hf_clip_layout(vocab=len(tokenizer), **dims)
    sd = _fill(layout, seed)
    t_width, context = layout["text_model.embeddings.position_embedding.weight"][::-1]
    v_width, _, patch, _ = layout["vision_model.embeddings.patch_embedding.weight"]
    n_pos = layout["vision_model.embeddings.position_ids"][1]
    embed_dim = layout["text_projection.weight"][0]
    n_layers = lambda pre: len({k.split(".")[3] for k in layout if k.startswith(pre + ".encoder.layers.")})  # noqa: E731
    config = {
        "architectures": ["CLIPModel"], "model_type": "clip", "projection_dim": embed_dim, "logit_scale_init_value": 2.6592,
        "text_config": {"hidden_size": t_width, "intermediate_size": layout["text_model.encoder.layers.0.mlp.fc1.weight"][0],
                        "num_attention_heads": heads, "num_hidden_layers": n_layers("text_model"),
                        "max_position_embeddings": context, "vocab_size": len(tokenizer), "hidden_act": hidden_act,
                        "projection_dim": embed_dim, "eos_token_id": tokenizer.eos_token_id,
                        "bos_token_id": tokenizer.bos_token_id, "pad_token_id": tokenizer.pad_token_id,
                        "layer_norm_eps": 1e-5},
        "vision_config": {"hidden_size": v_width, "intermediate_size": layout["vision_model.encoder.layers.0.mlp.fc1.weight"][0],
                          "num_attention_heads": heads, "num_hidden_layers": n_layers("vision_model"),
                          "image_size": int(round(math.sqrt(n_pos - 1))) * patch, "patch_size": patch,
                          "hidden_act": hidden_act, "projection_dim": embed_dim, "layer_norm_eps": 1e-5},
    }
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(str(path))
    return sd
