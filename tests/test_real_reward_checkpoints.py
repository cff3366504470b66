"""The four real rewards load checkpoints laid out like the published files and score with them.

The checkpoints come from tests/_published_layouts.py (key layouts transcribed from the code that
saved each published file, not from the classes solbench loads them into); the reference scores
are computed from the checkpoint tensors alone (ImageReward: BLIP ViT and med.py BERT written out;
HPSv2: open_clip's forward), or, for the transformers-native CLIP checkpoints, by the formula.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import _published_layouts as pub
from solbench.rewards import real
from solbench.rewards.real import (CLIPScoreReward, HPSv2Reward, ImageRewardReward, PickScoreReward,
                                   clip_preprocess, convert_imagereward_state_dict)
from test_real_rewards import PROMPTS, _clip_tokenizer, _images, _open_clip_tokens, _OpenCLIP

V_CFG = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
WORDS = ["a", "red", "cat", "two", "blue", "dogs", "tree", "and", "dog"]


def _bert_vocab_dir(path):
    """A bert-base-uncased-style tokenizer directory (vocab.txt only), loaded by the reward itself."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS) + "\n")
    return path


@pytest.fixture(scope="module")
def ir_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("imagereward")
    sd = pub.imagereward_checkpoint(vocab=len(WORDS) + 7)  # + [DEC] and [ENC] added by BLIP's tokenizer
    torch.save(sd, d / "ImageReward.pt")
    (d / "med_config.json").write_text(json.dumps(pub.med_config(vocab=len(WORDS) + 7)))
    return d, sd


def test_imagereward_loads_the_published_layout_and_scores_like_blip(ir_dir, tmp_path):
    d, sd = ir_dir
    # the keys that broke the loader: med.py's persistent buffer and BLIP_Pretrain's unused projections
    assert {"blip.text_encoder.embeddings.position_ids", "blip.vision_proj.weight", "blip.text_proj.bias"} <= set(sd)
    reward = ImageRewardReward(checkpoint=str(d), tokenizer_id=str(_bert_vocab_dir(tmp_path / "bert")),
                               vision_config=V_CFG, device="cpu", batch_size=2)
    images = _images()
    scores = reward(images, PROMPTS)  # loads: the bug raised "checkpoint does not fit: unexpected [...position_ids]"
    tok = reward.tokenizer
    t = tok(PROMPTS, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    with torch.no_grad():
        ref = pub.imagereward_reference(sd, clip_preprocess(images, 32), t["input_ids"], t["attention_mask"],
                                        v_heads=4, t_heads=4, patch=8)
    torch.testing.assert_close(scores, ref, rtol=1e-4, atol=1e-5)
    assert scores.std() > 1e-2


def test_imagereward_conversion_uses_every_weight_of_the_published_file(ir_dir):
    _, sd = ir_dir
    out = convert_imagereward_state_dict(sd)
    used = {k for k in sd if not k.startswith(("blip.vision_proj", "blip.text_proj")) and not k.endswith("position_ids")}
    assert len(out) == len(used)  # nothing but the unused projections and the buffer is dropped
    assert not any(k.endswith("position_ids") for k in out)


def test_hpsv2_loads_the_published_layout_and_scores_like_open_clip(tmp_path):
    tok = _clip_tokenizer()
    ckpt = pub.hps_checkpoint(vocab=len(tok))
    assert set(ckpt) == {"state_dict"} and "attn_mask" not in ckpt["state_dict"]
    torch.save(ckpt, tmp_path / "HPS_v2.1_compressed.pt")
    tok.save_pretrained(str(tmp_path / "tok"))
    reward = HPSv2Reward(checkpoint=str(tmp_path), tokenizer_id=str(tmp_path / "tok"), vision_heads=3, text_heads=4,
                         device="cpu")
    images = _images()
    scores = reward(images, PROMPTS)
    oc = _OpenCLIP(vocab=len(tok)).eval()
    oc.load_state_dict(ckpt["state_dict"], strict=True)  # the open_clip transcription takes the file as is
    with torch.no_grad():
        ref = (oc.encode_image(clip_preprocess(images, 32)) * oc.encode_text(_open_clip_tokens(tok, PROMPTS))).sum(-1)
    torch.testing.assert_close(scores, ref, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("clip")
    tok = _clip_tokenizer()
    sd = pub.write_hf_clip_dir(d, tok)
    return d, sd, tok


def _reference_cos(d, sd, tok, images, prompts):
    from transformers import CLIPConfig, CLIPModel

    model = CLIPModel(CLIPConfig(**json.loads((d / "config.json").read_text()))).eval()
    missing, unexpected = model.load_state_dict({k: v for k, v in sd.items() if not k.endswith("position_ids")},
                                                strict=False)
    assert not unexpected and all(k.endswith("position_ids") for k in missing)
    t = tok(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=t["input_ids"], attention_mask=t["attention_mask"], pixel_values=clip_preprocess(images, 32))
    return F.cosine_similarity(out.image_embeds, out.text_embeds, dim=-1)


def test_pickscore_loads_the_published_layout(clip_dir):
    d, sd, tok = clip_dir
    assert "text_model.embeddings.position_ids" in sd and "vision_model.embeddings.position_ids" in sd
    images = _images()
    scores = PickScoreReward(model_id=str(d), tokenizer_id=str(d), device="cpu")(images, PROMPTS)
    cos = _reference_cos(d, sd, tok, images, PROMPTS)
    torch.testing.assert_close(scores, 100.0 * cos / 26.0, rtol=1e-4, atol=1e-5)  # logit_scale = log 100 in the file


def test_clipscore_loads_the_published_layout(clip_dir):
    d, sd, tok = clip_dir
    images = _images()
    scores = CLIPScoreReward(model_id=str(d), device="cpu")(images, PROMPTS)
    cos = _reference_cos(d, sd, tok, images, PROMPTS)
    torch.testing.assert_close(scores, cos.clamp_min(0), rtol=1e-4, atol=1e-5)
    assert real.WEIGHTS["clipscore"][0].repo_id == "openai/clip-vit-large-patch14"
