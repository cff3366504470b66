"""Real reward models (solbench.rewards.real) on tiny randomly-initialised models of the real classes.

No weights are downloaded: each test builds a transformers CLIPModel / BLIP model from a small
config, and the open_clip and BLIP-timm checkpoint layouts from small reference modules written
here (transcriptions of open_clip's and BLIP's forward passes, with their parameter names), so the
key conversions are checked against an independent forward pass, not against themselves.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from solbench.errors import MissingWeightsError
from solbench.rewards import real
from solbench.rewards.real import (
    CLIPScoreReward,
    HPSv2Reward,
    ImageRewardModel,
    ImageRewardReward,
    PickScoreReward,
    WeightedSum,
    clip_preprocess,
    convert_imagereward_state_dict,
    convert_open_clip_state_dict,
    imagereward_text_config,
    imagereward_vision_config,
    load_open_clip_as_clip_model,
)

PROMPTS = ["a red cat", "two blue dogs", "a tree", "a cat and a dog", "red"]


# ------------------------------------------------------------------------------------------------
# Tiny components
# ------------------------------------------------------------------------------------------------


def _clip_tokenizer():
    from transformers import CLIPTokenizer

    chars = "abcdefghijklmnopqrstuvwxyz"
    vocab = {}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    for tok in ("!", "!</w>", "<|startoftext|>", "<|endoftext|>"):  # eos has the highest id, as in CLIP's BPE
        vocab[tok] = len(vocab)
    return CLIPTokenizer(vocab=vocab, merges=[], pad_token="!", model_max_length=77)


@pytest.fixture(scope="module")
def clip_tok():
    return _clip_tokenizer()


def _tiny_clip(tok, image_size=32, logit_scale=math.log(100.0)):
    from transformers import CLIPConfig, CLIPModel

    torch.manual_seed(1)
    cfg = CLIPConfig(
        text_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                         vocab_size=len(tok), max_position_embeddings=77, projection_dim=16,
                         eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2,
                           image_size=image_size, patch_size=8, projection_dim=16),
        projection_dim=16, logit_scale_init_value=logit_scale,
    )
    return CLIPModel(cfg).eval()


@pytest.fixture(scope="module")
def tiny_clip(clip_tok):
    return _tiny_clip(clip_tok)


def _images(n=5, h=40, w=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, h, w, generator=g)


def _clip_forward_logits(model, tok, images, prompts, size):
    """CLIPModel.forward's logits_per_image diagonal: logit_scale.exp() * cos, by transformers' own path."""
    pixels = clip_preprocess(images, size)
    t = tok(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], pixel_values=pixels)
    return out.logits_per_image.diagonal(), out


# ------------------------------------------------------------------------------------------------
# Preprocessing
# ------------------------------------------------------------------------------------------------


def test_preprocess_matches_clip_image_processor():
    from transformers import CLIPImageProcessor

    # 3x64x80 uint8 image: the short side goes 64 -> 32, the crop offset (40-32)/2 = 4 is exact.
    g = torch.Generator().manual_seed(3)
    u8 = (torch.rand(1, 3, 8, 10, generator=g) * 255)
    u8 = F.interpolate(u8, size=(64, 80), mode="bilinear", align_corners=False).round().clamp(0, 255).to(torch.uint8)
    proc = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    ref = proc(images=[u8[0].permute(1, 2, 0).numpy()], return_tensors="pt")["pixel_values"]
    ours = clip_preprocess(u8.float() / 255.0, 32)
    assert ours.shape == ref.shape == (1, 3, 32, 32)
    # PIL resamples in uint8; the rest is the same arithmetic. One uint8 step is 1/255/0.27 = 0.0146.
    diff = (ours - ref).abs()
    assert diff.mean() < 0.01 and diff.max() < 0.06, (diff.mean(), diff.max())


def test_preprocess_square_input_at_size_is_plain_normalisation():
    x = _images(2, 32, 32)
    mean = torch.tensor(real.CLIP_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(real.CLIP_STD).view(1, 3, 1, 1)
    torch.testing.assert_close(clip_preprocess(x, 32), (x - mean) / std)


def test_preprocess_rejects_wrong_shape():
    with pytest.raises(ValueError, match=r"\[B,3,H,W\]"):
        clip_preprocess(torch.rand(3, 32, 32), 32)


# ------------------------------------------------------------------------------------------------
# PickScore and CLIPScore
# ------------------------------------------------------------------------------------------------


def test_pickscore_is_logit_scale_times_cosine_over_26(tiny_clip, clip_tok):
    images = _images()
    reward = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu")
    scores = reward(images, PROMPTS)
    logits, out = _clip_forward_logits(tiny_clip, clip_tok, images, PROMPTS, 32)
    assert scores.dtype == torch.float32 and scores.device.type == "cpu" and scores.shape == (5,)
    torch.testing.assert_close(scores, logits / 26.0, rtol=1e-5, atol=1e-6)
    # and by hand from the embeddings: 100 * cos / 26 (logit_scale initialised to log 100)
    cos = F.cosine_similarity(out.image_embeds, out.text_embeds, dim=-1)
    torch.testing.assert_close(scores, 100.0 * cos / 26.0, rtol=1e-4, atol=1e-5)
    raw = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu", divisor=1.0)(images, PROMPTS)
    torch.testing.assert_close(raw, 26.0 * scores, rtol=1e-5, atol=1e-5)


def test_clipscore_is_clamped_raw_cosine(tiny_clip, clip_tok):
    import copy

    images = _images()
    _, out = _clip_forward_logits(tiny_clip, clip_tok, images, PROMPTS, 32)
    cos = F.cosine_similarity(out.image_embeds, out.text_embeds, dim=-1)
    flipped = copy.deepcopy(tiny_clip)
    with torch.no_grad():
        flipped.visual_projection.weight.neg_()  # image embeddings -> -e, cosine -> -cos
    a = CLIPScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu")(images, PROMPTS)
    b = CLIPScoreReward(model=flipped, tokenizer=clip_tok, device="cpu")(images, PROMPTS)
    torch.testing.assert_close(a, cos.clamp_min(0), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(b, (-cos).clamp_min(0), rtol=1e-4, atol=1e-6)
    assert ((a == 0) | (b == 0)).all() and (a + b > 0).all()
    hessel = CLIPScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu", scale=2.5)(images, PROMPTS)
    torch.testing.assert_close(hessel, 2.5 * a, rtol=1e-5, atol=1e-6)


def test_batching_and_order_invariance(tiny_clip, clip_tok):
    images = _images(7)
    prompts = (PROMPTS * 2)[:7]
    full = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu", batch_size=32)(images, prompts)
    chunked = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu", batch_size=3)(images, prompts)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-6)
    perm = torch.tensor([6, 2, 0, 5, 1, 4, 3])
    shuffled = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu", batch_size=3)(
        images[perm], [prompts[i] for i in perm])
    torch.testing.assert_close(shuffled, full[perm], rtol=1e-5, atol=1e-6)
    # the prompt matters: pairing images with other prompts changes the scores
    other = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu")(images, prompts[::-1])
    assert not torch.allclose(other, full)


def test_dtype_and_device_handling(clip_tok):
    model = _tiny_clip(clip_tok)
    images = _images()
    fp32 = PickScoreReward(model=_tiny_clip(clip_tok), tokenizer=clip_tok, device="cpu")(images, PROMPTS)
    r = PickScoreReward(model=model, tokenizer=clip_tok, device=None, dtype="bfloat16")
    assert r.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    out = r(images.double(), PROMPTS)  # any float input dtype is accepted
    assert out.dtype == torch.float32 and out.device.type == "cpu"
    assert next(r.model.parameters()).dtype == torch.bfloat16
    assert (out - fp32).abs().max() < 0.1 * fp32.abs().max() + 0.05
    with pytest.raises(ValueError, match="unknown reward dtype"):
        PickScoreReward(model=model, tokenizer=clip_tok, dtype="int8")


def test_input_validation(tiny_clip, clip_tok):
    r = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu")
    with pytest.raises(ValueError, match="5 images but 2 prompts"):
        r(_images(), PROMPTS[:2])
    with pytest.raises(ValueError, match=r"\[B,3,H,W\]"):
        r(torch.rand(5, 32, 32), PROMPTS)
    assert r(_images(0), []).shape == (0,)


# ------------------------------------------------------------------------------------------------
# Missing weights and lazy registration
# ------------------------------------------------------------------------------------------------


def test_missing_hub_weights_raise_with_repo_and_command():
    r = PickScoreReward(model_id="solbench-test/absent-pickscore", device="cpu")
    assert not r.loaded  # constructing reads nothing
    with pytest.raises(MissingWeightsError) as err:
        r(_images(1), ["a cat"])
    msg = str(err.value)
    assert "solbench-test/absent-pickscore" in msg
    assert "hf download solbench-test/absent-pickscore" in msg and "huggingface-cli" not in msg  # deprecated CLI


def test_missing_checkpoint_file_raises_with_repo_file_and_command(tmp_path):
    hps = HPSv2Reward(checkpoint="solbench-test/absent-hps", device="cpu")
    with pytest.raises(MissingWeightsError, match=r"HPS_v2\.1_compressed\.pt from solbench-test/absent-hps") as err:
        hps.load()
    assert "hf download solbench-test/absent-hps --include 'HPS_v2.1_compressed.pt'" in str(err.value)
    ir = ImageRewardReward(checkpoint=str(tmp_path), device="cpu")  # a local directory without the file
    with pytest.raises(MissingWeightsError, match="ImageReward.pt"):
        ir.load()


def test_default_sources_name_the_real_repositories():
    assert PickScoreReward().model_id == "yuvalkirstain/PickScore_v1"
    assert PickScoreReward().tokenizer_id == "laion/CLIP-ViT-H-14-laion2B-s32B-b79K"
    assert CLIPScoreReward().model_id == "openai/clip-vit-large-patch14"
    assert HPSv2Reward().checkpoint == "xswu/HPSv2" and HPSv2Reward().filename == "HPS_v2.1_compressed.pt"
    assert ImageRewardReward().checkpoint == "THUDM/ImageReward"
    assert set(real.WEIGHTS) == {"imagereward", "pickscore", "hpsv2", "clipscore"}


def test_register_real_rewards_is_lazy():
    registered = {}
    real.register_real_rewards(lambda name, factory: registered.__setitem__(name, factory))
    assert sorted(registered) == ["clipscore", "hpsv2", "imagereward", "pickscore"]
    for name, factory in registered.items():
        reward = factory(device="cpu")
        assert reward.name == name and not reward.loaded and reward.higher_is_better
        lo, hi = reward.range
        assert lo < hi


def test_weighted_sum(tiny_clip, clip_tok):
    images = _images()
    pick = PickScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu")
    clip = CLIPScoreReward(model=tiny_clip, tokenizer=clip_tok, device="cpu")
    total, parts = WeightedSum({"pickscore": pick, "clipscore": clip}, {"pickscore": 0.7, "clipscore": 2.0})(images, PROMPTS)
    torch.testing.assert_close(total, 0.7 * pick(images, PROMPTS) + 2.0 * clip(images, PROMPTS))
    assert set(parts) == {"pickscore", "clipscore"}
    with pytest.raises(ValueError, match="name different rewards"):
        WeightedSum({"pickscore": pick}, {"clipscore": 1.0})


# ------------------------------------------------------------------------------------------------
# HPSv2.1: open_clip layout -> transformers CLIPModel
# ------------------------------------------------------------------------------------------------


class _OCBlock(nn.Module):
    """open_clip ResidualAttentionBlock (ls_* are Identity and hold no parameters)."""

    def __init__(self, width, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(width, 4 * width), gelu=nn.GELU(),
                                             c_proj=nn.Linear(4 * width, width)))

    def forward(self, x, attn_mask=None):  # x: [L, B, W] (open_clip's sequence-first layout)
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, need_weights=False, attn_mask=attn_mask)[0]
        return x + self.mlp(self.ln_2(x))


class _OCTransformer(nn.Module):
    def __init__(self, width, layers, heads):
        super().__init__()
        self.resblocks = nn.ModuleList([_OCBlock(width, heads) for _ in range(layers)])

    def forward(self, x, attn_mask=None):
        for block in self.resblocks:
            x = block(x, attn_mask)
        return x


class _OCVisual(nn.Module):
    def __init__(self, image_size, patch, width, layers, heads, out_dim):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, patch, patch, bias=False)
        scale = width ** -0.5
        self.class_embedding = nn.Parameter(scale * torch.randn(width))
        self.positional_embedding = nn.Parameter(scale * torch.randn((image_size // patch) ** 2 + 1, width))
        self.ln_pre = nn.LayerNorm(width)
        self.transformer = _OCTransformer(width, layers, heads)
        self.ln_post = nn.LayerNorm(width)
        self.proj = nn.Parameter(scale * torch.randn(width, out_dim))

    def forward(self, x):
        x = self.conv1(x).flatten(2).permute(0, 2, 1)
        cls = self.class_embedding.to(x.dtype) + torch.zeros(x.shape[0], 1, x.shape[-1])
        x = torch.cat([cls, x], dim=1) + self.positional_embedding
        x = self.ln_pre(x).permute(1, 0, 2)
        x = self.transformer(x).permute(1, 0, 2)
        return self.ln_post(x[:, 0]) @ self.proj


class _OpenCLIP(nn.Module):
    """open_clip.CLIP with a ViT tower and the built-in text tower (ViT-H-14's layout), tiny."""

    def __init__(self, vocab, context=77, embed_dim=16, v_width=48, v_layers=2, v_heads=3, t_width=32, t_layers=2,
                 t_heads=4, image_size=32, patch=8):
        super().__init__()
        self.visual = _OCVisual(image_size, patch, v_width, v_layers, v_heads, embed_dim)
        self.transformer = _OCTransformer(t_width, t_layers, t_heads)
        self.token_embedding = nn.Embedding(vocab, t_width)
        self.positional_embedding = nn.Parameter(0.01 * torch.randn(context, t_width))
        self.ln_final = nn.LayerNorm(t_width)
        self.text_projection = nn.Parameter(t_width ** -0.5 * torch.randn(t_width, embed_dim))
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))
        mask = torch.full((context, context), float("-inf")).triu_(1)
        self.register_buffer("attn_mask", mask, persistent=False)
        for p in self.parameters():  # LayerNorms away from identity so a swapped norm would show
            if p.ndim == 1 and p.shape[0] in (t_width, v_width):
                with torch.no_grad():
                    p.add_(0.1 * torch.randn_like(p))

    def encode_image(self, pixels):
        return F.normalize(self.visual(pixels), dim=-1)

    def encode_text(self, text):
        x = self.token_embedding(text) + self.positional_embedding
        x = self.transformer(x.permute(1, 0, 2), attn_mask=self.attn_mask).permute(1, 0, 2)
        x = self.ln_final(x)
        x = x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection
        return F.normalize(x, dim=-1)


def _open_clip_tokens(tok, prompts, context=77):
    """open_clip's tokenizer output: [sot] tokens [eot], zero-padded to the context length."""
    ids = torch.zeros(len(prompts), context, dtype=torch.long)
    for i, p in enumerate(prompts):
        t = tok(p)["input_ids"][:context]
        ids[i, : len(t)] = torch.tensor(t)
    return ids


@pytest.fixture(scope="module")
def open_clip_model(clip_tok):
    torch.manual_seed(2)
    return _OpenCLIP(vocab=len(clip_tok)).eval()


def test_open_clip_conversion_reproduces_open_clip_features(open_clip_model, clip_tok):
    sd = open_clip_model.state_dict()
    assert "attn_mask" not in sd and "visual.transformer.resblocks.0.attn.in_proj_weight" in sd
    config, _ = convert_open_clip_state_dict(sd, vision_heads=3, text_heads=4)
    assert (config.vision_config.image_size, config.vision_config.patch_size) == (32, 8)
    assert config.vision_config.num_hidden_layers == 2 and config.text_config.hidden_size == 32
    hf = load_open_clip_as_clip_model(sd, vision_heads=3, text_heads=4)
    pixels = clip_preprocess(_images(), 32)
    ids = _open_clip_tokens(clip_tok, PROMPTS)
    with torch.no_grad():
        ref_img = open_clip_model.encode_image(pixels)
        ref_txt = open_clip_model.encode_text(ids)
        img = F.normalize(hf.visual_projection(hf.vision_model(pixel_values=pixels).pooler_output), dim=-1)
        txt = F.normalize(hf.text_projection(hf.text_model(input_ids=ids).pooler_output), dim=-1)
    torch.testing.assert_close(img, ref_img, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(txt, ref_txt, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(hf.logit_scale, open_clip_model.logit_scale)


def test_hpsv2_score_is_open_clip_cosine_loaded_from_a_checkpoint_file(open_clip_model, clip_tok, tmp_path):
    torch.save({"state_dict": open_clip_model.state_dict()}, tmp_path / "HPS_v2.1_compressed.pt")
    reward = HPSv2Reward(checkpoint=str(tmp_path), tokenizer=clip_tok, vision_heads=3, text_heads=4,
                         device="cpu", batch_size=2)
    images = _images()
    scores = reward(images, PROMPTS)
    with torch.no_grad():  # hpsv2.score(): diag(image_features @ text_features.T), no logit scale
        pixels = clip_preprocess(images, 32)
        ref = (open_clip_model.encode_image(pixels) @ open_clip_model.encode_text(_open_clip_tokens(clip_tok, PROMPTS)).T).diagonal()
    torch.testing.assert_close(scores, ref, rtol=1e-4, atol=1e-5)
    assert reward.loaded and reward.image_size == 32


def test_open_clip_conversion_rejects_other_layouts(open_clip_model):
    sd = dict(open_clip_model.state_dict())
    del sd["visual.proj"]
    with pytest.raises(ValueError, match="missing"):
        convert_open_clip_state_dict(sd)
    with pytest.raises(ValueError, match="not divisible"):
        convert_open_clip_state_dict(open_clip_model.state_dict(), vision_heads=5, text_heads=4)


# ------------------------------------------------------------------------------------------------
# ImageReward: BLIP (timm ViT + med.py BERT) layout -> transformers BLIP modules
# ------------------------------------------------------------------------------------------------

V_CFG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
MED = {"vocab_size": 40, "hidden_size": 24, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
       "hidden_act": "gelu", "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "pad_token_id": 0,
       "add_cross_attention": True, "encoder_width": 32}


def _bert_tokenizer():
    from transformers import BertTokenizer

    words = ["a", "red", "cat", "two", "blue", "dogs", "tree", "and", "dog"]
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words)}
    return real.add_blip_special_tokens(BertTokenizer(vocab=vocab))


def _timm_vit_reference(sd, pixels, heads, patch, eps=1e-6):
    """BLIP's VisionTransformer.forward (timm layout), written out from its parameter names."""
    p = lambda k: sd["blip.visual_encoder." + k]  # noqa: E731
    x = F.conv2d(pixels, p("patch_embed.proj.weight"), p("patch_embed.proj.bias"), stride=patch)
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([p("cls_token").expand(x.shape[0], -1, -1), x], dim=1) + p("pos_embed")[:, : x.shape[1] + 1]
    width = x.shape[-1]
    i = 0
    while f"blip.visual_encoder.blocks.{i}.norm1.weight" in sd:
        b = f"blocks.{i}."
        y = F.layer_norm(x, (width,), p(b + "norm1.weight"), p(b + "norm1.bias"), eps)
        B, N, C = y.shape
        qkv = F.linear(y, p(b + "attn.qkv.weight"), p(b + "attn.qkv.bias")).reshape(B, N, 3, heads, C // heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        att = ((q @ k.transpose(-2, -1)) * (C // heads) ** -0.5).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, N, C)
        x = x + F.linear(y, p(b + "attn.proj.weight"), p(b + "attn.proj.bias"))
        y = F.layer_norm(x, (width,), p(b + "norm2.weight"), p(b + "norm2.bias"), eps)
        y = F.linear(F.gelu(F.linear(y, p(b + "mlp.fc1.weight"), p(b + "mlp.fc1.bias"))), p(b + "mlp.fc2.weight"),
                     p(b + "mlp.fc2.bias"))
        x = x + y
        i += 1
    return F.layer_norm(x, (width,), p("norm.weight"), p("norm.bias"), eps)


def _imagereward_checkpoint():
    """A state dict in ImageReward.pt's published layout (tests/_published_layouts.py): timm-ViT keys,
    med.py BERT keys with its persistent position_ids buffer, the MLP, and BLIP's unused projections."""
    import _published_layouts as pub

    return pub.imagereward_checkpoint(seed=4)


def _hand_imagereward(sd, model, pixels, input_ids, attention_mask):
    """ImageReward.score(): [CLS] of the cross-attending text encoder -> 5 linears -> (r - mean) / std."""
    image_embeds = _timm_vit_reference(sd, pixels, V_CFG["num_attention_heads"], V_CFG["patch_size"])
    text = model.text_encoder(input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=image_embeds,
                              encoder_attention_mask=torch.ones(image_embeds.shape[:2], dtype=torch.long))
    h = text.last_hidden_state[:, 0, :]
    for idx in (0, 2, 4, 6, 7):  # no activations between the layers, as in the package
        h = h @ sd[f"mlp.layers.{idx}.weight"].T + sd[f"mlp.layers.{idx}.bias"]
    return (h.squeeze(-1) - 0.16717362830052426) / 1.0333394966054072


@pytest.fixture(scope="module")
def imagereward_ckpt():
    return _imagereward_checkpoint()


def _imagereward_model(sd):
    vcfg = imagereward_vision_config(**V_CFG)
    model = ImageRewardModel(vcfg, imagereward_text_config(MED, encoder_hidden_size=vcfg.hidden_size))
    missing, unexpected = model.load_state_dict(convert_imagereward_state_dict(sd), strict=False)
    assert [k for k in missing if not k.endswith("position_ids")] == [] and unexpected == []
    return model.eval()


def test_imagereward_vision_conversion_matches_blip_vit(imagereward_ckpt):
    model = _imagereward_model(imagereward_ckpt)
    pixels = clip_preprocess(_images(3), 32)
    with torch.no_grad():
        ours = model.vision_model(pixel_values=pixels).last_hidden_state
        ref = _timm_vit_reference(imagereward_ckpt, pixels, V_CFG["num_attention_heads"], V_CFG["patch_size"])
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_imagereward_score_matches_hand_computation(imagereward_ckpt):
    model = _imagereward_model(imagereward_ckpt)
    tok = _bert_tokenizer()
    reward = ImageRewardReward(model=model, tokenizer=tok, device="cpu", batch_size=2)
    images = _images()
    scores = reward(images, PROMPTS)
    t = tok(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert t["input_ids"].shape == (5, 35) and (t["input_ids"][:, 0] == tok.cls_token_id).all()
    with torch.no_grad():
        ref = _hand_imagereward(imagereward_ckpt, model, clip_preprocess(images, 32), t["input_ids"], t["attention_mask"])
    torch.testing.assert_close(scores, ref, rtol=1e-4, atol=1e-5)
    assert scores.std() > 1e-3  # images/prompts actually move the score
    swapped = reward(images, PROMPTS[::-1])
    assert not torch.allclose(swapped, scores)


def test_imagereward_loads_from_checkpoint_directory(imagereward_ckpt, tmp_path):
    torch.save(imagereward_ckpt, tmp_path / "ImageReward.pt")
    (tmp_path / "med_config.json").write_text(json.dumps(MED))
    tok = _bert_tokenizer()
    reward = ImageRewardReward(checkpoint=str(tmp_path), tokenizer=tok, vision_config=V_CFG, device="cpu")
    direct = ImageRewardReward(model=_imagereward_model(imagereward_ckpt), tokenizer=tok, device="cpu")
    images = _images(3)
    torch.testing.assert_close(reward(images, PROMPTS[:3]), direct(images, PROMPTS[:3]))


def test_imagereward_conversion_refuses_unknown_keys(imagereward_ckpt):
    bad = dict(imagereward_ckpt)
    bad["blip.visual_encoder.blocks.0.attn.extra_weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="extra_weight"):
        convert_imagereward_state_dict(bad)


def test_imagereward_bfloat16_keeps_the_standardisation_constants(imagereward_ckpt):
    tok = _bert_tokenizer()
    images = _images(4)
    fp32 = ImageRewardReward(model=_imagereward_model(imagereward_ckpt), tokenizer=tok, device="cpu")(images, PROMPTS[:4])
    reward = ImageRewardReward(model=_imagereward_model(imagereward_ckpt), tokenizer=tok, device="cpu", dtype="bfloat16")
    bf16 = reward(images, PROMPTS[:4])
    assert reward.model.mean == 0.16717362830052426 and reward.model.std == 1.0333394966054072
    assert next(reward.model.parameters()).dtype == torch.bfloat16 and bf16.dtype == torch.float32
    assert (bf16 - fp32).abs().max() < 0.05 * fp32.abs().max() + 0.05
