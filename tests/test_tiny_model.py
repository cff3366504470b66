"""The tiny embedded model: contract shapes, LoRA/dtype stand-ins, shipped weights, golden samples."""

import copy
import json

import pytest
import torch

from solbench.errors import MissingWeightsError
from solbench.models import tiny
from solbench.models.tiny import TinyT2I, load_tiny
from solbench.rewards.shapes import ShapesGenEval
from solbench.world.prompts import load_prompt_set

from _scripts import script_module


@pytest.fixture(scope="module")
def random_model():
    return load_tiny(pretrained=False)


def test_random_init_is_seeded_and_leaves_global_rng_alone(random_model):
    state = torch.random.get_rng_state()
    again = load_tiny(pretrained=False)
    assert torch.equal(torch.random.get_rng_state(), state)
    for (k, a), (_, b) in zip(random_model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), k


def test_encode_and_velocity_shapes(random_model):
    m = random_model
    tokens, pooled = m.encode(["a red circle", "", "three blue squares"])
    assert tokens.shape == (3, m.config.max_length, m.config.text_dim) and pooled.shape == (3, m.config.text_dim)
    x = torch.randn(3, *m.config.latent_shape)
    v = m.velocity(m.transformer, x, torch.tensor([0.1, 0.5, 1.0]), tokens, pooled)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    # A scalar time broadcasts over the batch.
    torch.testing.assert_close(m.velocity(m.transformer, x, torch.tensor(0.5), tokens, pooled),
                               m.velocity(m.transformer, x, torch.full((3,), 0.5), tokens, pooled))


def test_tokenizer_pads_and_marks_unknown_words(random_model):
    ids = random_model.tokenizer(["", "a red circle", "a crimson circle"])
    assert ids.shape == (3, random_model.config.max_length)
    assert ids[0].eq(0).all()
    assert ids[1, :3].ne(0).all() and ids[1, 3:].eq(0).all()
    assert ids[2, 1].item() == 1 and ids[2, 0] == ids[1, 0]  # <unk>, same "a"


def test_pack_unpack_round_trip_and_patch_layout(random_model):
    x = torch.arange(2 * 3 * 32 * 32, dtype=torch.float32).reshape(2, 3, 32, 32)
    packed = random_model.pack(x)
    assert packed.shape == (2, 64, 48)
    torch.testing.assert_close(random_model.unpack(packed), x)
    # Token 1 is the patch at row 0, columns 4-7; channel-major inside the token.
    torch.testing.assert_close(packed[0, 1, :16], x[0, 0, :4, 4:8].reshape(-1))


def test_velocity_accepts_lora_and_low_precision_stand_ins(random_model):
    from peft import LoraConfig, get_peft_model

    m = random_model
    tokens, pooled = m.encode(["a red circle", "two green squares"])
    x, t = torch.randn(2, 3, 32, 32), torch.tensor([0.3, 0.8])
    base = m.velocity(m.transformer, x, t, tokens, pooled)
    lora = get_peft_model(copy.deepcopy(m.transformer), LoraConfig(r=4, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
    torch.testing.assert_close(m.velocity(lora, x, t, tokens, pooled), base)  # LoRA B starts at zero
    low = copy.deepcopy(m.transformer).to(torch.bfloat16)
    v_low = m.velocity(low, x, t, tokens, pooled)
    assert v_low.dtype == torch.float32
    assert (v_low - base).pow(2).mean() < 0.05 * base.pow(2).mean()


def test_missing_weights_error_says_how_to_get_them(monkeypatch, tmp_path):
    monkeypatch.setattr(tiny, "asset_path", lambda name: tmp_path / name)
    with pytest.raises(MissingWeightsError, match="pretrain_tiny.py"):
        load_tiny(pretrained=True)


def test_save_and_load_round_trip(monkeypatch, tmp_path, random_model):
    tiny.save_tiny(random_model, tmp_path / "tiny_t2i.safetensors", tmp_path / "tiny_t2i.json")
    monkeypatch.setattr(tiny, "asset_path", lambda name: tmp_path / name)
    loaded = load_tiny(pretrained=True)
    for (k, a), (_, b) in zip(random_model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), k
    assert json.loads((tmp_path / "tiny_t2i.json").read_text())["latent_shape"] == [3, 32, 32]


# -- the shipped, pretrained model


@pytest.fixture(scope="module")
def shipped():
    return load_tiny(pretrained=True)


def test_shipped_model_config(shipped):
    assert isinstance(shipped, TinyT2I)
    assert shipped.config.latent_shape == (3, 32, 32)
    n_params = sum(p.numel() for p in shipped.parameters())
    # width 256 (8 heads x 32): 7.1 M parameters, 28.6 MB in fp32 (docs/embedded-world.md, ninth round)
    assert shipped.config.num_attention_heads * shipped.config.attention_head_dim == 256
    assert 5_000_000 < n_params < 9_000_000
    assert tiny.asset_path("tiny_t2i.safetensors").stat().st_size < 32_000_000


# -- the pretraining script


def _pretrain_module():
    return script_module("pretrain_tiny")


def _run(module, folder, *extra):
    args = ["--batch", "4", "--checkpoint-every", "2", "--log-every", "2", "--no-eval", "--threads", "1",
            "--workdir", str(folder), "--out", str(folder), *extra]
    assert module.main(args) == 0
    from safetensors.torch import load_file

    return load_file(str(folder / "tiny_t2i.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("stage", [(), ("--noise-consistency", "5", "--consistency-kind", "nvfp4", "--shift", "3"),
                                   ("--noise-consistency", "5", "--consistency-kind", "nvfp4", "--consistency-recipe",
                                    "nvfp4_tiny_flux", "--consistency-anchor", "proj_out")],
                         ids=["plain", "nvfp4-consistency", "w4a4-consistency-against-a-recipe"])
def test_pretraining_is_deterministic_and_resumes_exactly(tmp_path, stage):
    # Bugs caught: data, noise or rounding that are not a function of (seed, step), so that a
    # resumed run (or the README's reproduce command) gives other weights than a straight one.
    module = _pretrain_module()
    straight = _run(module, tmp_path / "a", "--steps", "4", *stage)
    _run(module, tmp_path / "b", "--steps", "2", *stage)
    resumed = _run(module, tmp_path / "b", "--steps", "4", "--resume", *stage)
    again = _run(module, tmp_path / "c", "--steps", "4", *stage)
    assert straight.keys() == resumed.keys()
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
        assert torch.equal(straight[key], again[key]), key
    meta = json.loads((tmp_path / "b" / "tiny_t2i_train.json").read_text())
    assert meta["step"] == 4
    if stage:
        assert meta["noise_consistency"] == 5 and meta["consistency_kind"] == "nvfp4" and meta["recent_consistency"] > 0
    if "--shift" in stage:
        assert json.loads((tmp_path / "b" / "tiny_t2i.json").read_text())["shift"] == 3.0
    if "--consistency-recipe" in stage:
        assert meta["consistency_recipe"] == "nvfp4_tiny_flux" and meta["consistency_anchor"] == ["proj_out"]


@pytest.mark.slow
def test_pretraining_a_wider_model_from_scratch_and_continuing_it(tmp_path, capsys):
    # Bugs caught: --heads not reaching the model (a "width 256" run that trains and ships width 128), the
    # width missing from the saved config (the weights then fail to load, or load into the wrong shape),
    # and a later stage silently rebuilding the default width instead of continuing the wide model.
    from solbench.models.tiny import load_tiny

    module = _pretrain_module()
    _run(module, tmp_path / "wide", "--steps", "2", "--heads", "8")
    wide = load_tiny(folder=tmp_path / "wide")
    assert wide.config.num_attention_heads == 8 and wide.transformer.inner_dim == 256
    assert json.loads((tmp_path / "wide" / "tiny_t2i.json").read_text())["num_attention_heads"] == 8
    weights = _run(module, tmp_path / "next", "--steps", "2", "--init-from", str(tmp_path / "wide"))
    assert weights["transformer.proj_out.weight"].shape[1] == 256
    with pytest.raises(SystemExit):
        module.main(["--init-from", str(tmp_path / "wide"), "--heads", "4", "--steps", "1", "--no-eval",
                     "--workdir", str(tmp_path / "x"), "--out", str(tmp_path / "x")])
    assert "the --init-from model has 8 heads" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_distillation_from_a_frozen_teacher_measures_and_closes_the_gap_to_it(tmp_path, capsys):
    # Bugs caught: --distill-from loading another model than the folder named (the gap would not start at
    # 0 from the teacher's own weights), a teacher that trains along with the student (the gap stays 0),
    # a term that is logged but not added to the loss or enters with the wrong sign (a heavy weight would not
    # keep the student's velocity nearer its teacher's), a teacher that draws other latents accepted, and a
    # wider teacher refused (it encodes the captions with its own text encoder, so its width is free).
    module = _pretrain_module()
    _run(module, tmp_path / "teacher", "--steps", "2")

    def gaps(folder, weight):
        capsys.readouterr()
        _run(module, folder, "--init-from", str(tmp_path / "teacher"), "--steps", "5", "--log-every", "1",
             "--lr", "1e-3", "--warmup", "1", "--distill-from", str(tmp_path / "teacher"), "--distill-weight", weight)
        return [float(line.split("distill ")[1].split()[0]) for line in capsys.readouterr().out.splitlines()
                if " distill " in line]

    measured, held = gaps(tmp_path / "measured", "1e-9"), gaps(tmp_path / "held", "1000")
    assert len(held) == 5 and held[0] < 1e-10 and measured[0] < 1e-10  # step 1 starts at the teacher itself
    assert measured[1] > 1e-6 and measured[-1] > measured[1]  # the student drifts from its frozen teacher
    assert held[-1] < 0.5 * measured[-1]  # and the term, weighted, holds it near
    meta = json.loads((tmp_path / "held" / "tiny_t2i_train.json").read_text())
    assert meta["distill_from"] == str(tmp_path / "teacher") and meta["distill_weight"] == 1000
    assert meta["recent_distill"] == pytest.approx(held[-1], rel=1e-3)
    # a wider teacher is a teacher (it encodes the captions itself); one that draws other latents is refused
    _run(module, tmp_path / "wide", "--steps", "1", "--heads", "8")
    _run(module, tmp_path / "from_wide", "--init-from", str(tmp_path / "teacher"), "--steps", "1",
         "--distill-from", str(tmp_path / "wide"))
    assert json.loads((tmp_path / "from_wide" / "tiny_t2i_train.json").read_text())["distill_from"] == str(tmp_path / "wide")
    small = json.loads((tmp_path / "wide" / "tiny_t2i.json").read_text())
    (tmp_path / "wide" / "tiny_t2i.json").write_text(json.dumps({**small, "resolution": 16}))
    with pytest.raises(SystemExit):
        module.main(["--init-from", str(tmp_path / "teacher"), "--distill-from", str(tmp_path / "wide"),
                     "--steps", "1", "--no-eval", "--workdir", str(tmp_path / "x"), "--out", str(tmp_path / "x")])
    assert "the teacher's latent_shape (3, 16, 16) is not the model's (3, 32, 32)" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit):  # a weight without a teacher would otherwise train without the term, silently
        module.main(["--distill-weight", "10", "--steps", "1", "--no-eval", "--workdir", str(tmp_path / "x"),
                     "--out", str(tmp_path / "x")])
    assert "--distill-weight needs --distill-from" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.slow
def test_reflow_pairs_are_the_teachers_own_samples_and_a_stage_trains_on_them(tmp_path, capsys):
    # Bugs caught: pairs whose image was not drawn from the noise stored beside it or for the caption stored
    # beside it (a reflow stage would then learn nothing straight), guidance left out of the captioned rows
    # (`return v` in the sampler's velocity fails it), a generator that is not a pure function of its options,
    # a stage whose batch rows mix one pair's image with another's noise or caption, a stage that silently
    # trains on fresh scenes, and pairs of another resolution accepted.
    from safetensors import safe_open

    pretrain, reflow = _pretrain_module(), script_module("reflow_pairs")
    _run(pretrain, tmp_path / "teacher", "--steps", "2")
    teacher = load_tiny(folder=tmp_path / "teacher")
    args = ["--model-path", str(tmp_path / "teacher"), "--count", "12", "--chunk", "6", "--steps", "3",
            "--sampler", "euler", "--guidance", "3", "--caption-dropout", "0.3"]
    assert reflow.main([*args, "--out", str(tmp_path / "a.safetensors")]) == 0
    assert reflow.main([*args, "--out", str(tmp_path / "b.safetensors")]) == 0
    with safe_open(str(tmp_path / "a.safetensors"), framework="pt") as f:
        noise, images = f.get_tensor("noise"), f.get_tensor("images")
        captions = json.loads(f.metadata()["captions"])
        settings = json.loads(f.metadata()["settings"])
    with safe_open(str(tmp_path / "b.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("images"), images) and torch.equal(f.get_tensor("noise"), noise)
    assert settings["guidance"] == 3 and settings["sampler"] == "euler" and settings["shift"] == teacher.config.shift
    empty = [i for i, c in enumerate(captions) if not c]
    assert 0 < len(empty) < len(captions)  # both kinds of row are checked below
    # The oracle: the model's own reference Euler sampler (CFG as v_u + w (v_c - v_u)), row by row.
    for i, caption in enumerate(captions):
        with torch.no_grad():
            expected = teacher.generate([caption], noise[i:i + 1], 3, None if not caption else 3.0)
        torch.testing.assert_close(((images[i:i + 1] + 1) / 2).clamp(0, 1), expected, atol=1e-5, rtol=0)

    pairs = pretrain.ReflowPairs([tmp_path / "a.safetensors"])
    rows_images, rows_captions, rows_noise, t = pairs.batch(0, 5, 4)
    for image, caption, z in zip(rows_images, rows_captions, rows_noise):
        i = next(k for k in range(len(captions)) if torch.equal(noise[k], z))
        assert torch.equal(images[i], image) and captions[i] == caption
    assert torch.equal(pairs.batch(0, 5, 4)[2], rows_noise) and not torch.equal(pairs.batch(0, 6, 4)[2], rows_noise)
    assert ((t > 0) & (t < 1)).all()

    stage = ("--init-from", str(tmp_path / "teacher"), "--reflow-pairs", str(tmp_path / "a.safetensors"))
    straight = _run(pretrain, tmp_path / "s1", "--steps", "2", *stage)
    fresh = _run(pretrain, tmp_path / "s2", "--steps", "2", "--init-from", str(tmp_path / "teacher"))
    assert any(not torch.equal(straight[k], fresh[k]) for k in straight)  # the pairs, not fresh scenes, trained it
    meta = json.loads((tmp_path / "s1" / "tiny_t2i_train.json").read_text())
    assert meta["reflow_pairs"] == [str(tmp_path / "a.safetensors")] and meta["reflow_settings"] == [settings]
    with pytest.raises(SystemExit):
        pretrain.main([*stage, "--batch", "64", "--steps", "1", "--no-eval", "--workdir", str(tmp_path / "x"),
                       "--out", str(tmp_path / "x")])
    assert "12 pairs, fewer than one batch of 64" in capsys.readouterr().err and not (tmp_path / "x").exists()
    from safetensors.torch import save_file

    small = {"noise": noise[:, :, :16, :16].contiguous(), "images": images[:, :, :16, :16].contiguous()}
    save_file(small, str(tmp_path / "small.safetensors"), metadata={"captions": json.dumps(captions)})
    with pytest.raises(SystemExit):  # pairs of another resolution would broadcast or fail deep in the model
        pretrain.main(["--init-from", str(tmp_path / "teacher"), "--reflow-pairs", str(tmp_path / "small.safetensors"),
                       "--batch", "4", "--steps", "1", "--no-eval", "--workdir", str(tmp_path / "x"),
                       "--out", str(tmp_path / "x")])
    assert "images of shape (3, 16, 16), the model draws (3, 32, 32)" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="does not exist"):
        pretrain.main(["--reflow-pairs", str(tmp_path / "none.safetensors"), "--steps", "1", "--no-eval",
                       "--workdir", str(tmp_path / "x"), "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        reflow.main([*args[:4], "--count", "10", "--chunk", "4", "--out", str(tmp_path / "c.safetensors")])
    assert "must be a positive multiple of --chunk" in capsys.readouterr().err


def test_learning_rate_schedule_shape():
    module = _pretrain_module()
    f = [module.lr_factor(s, warmup=10, total=100) for s in range(100)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)
    assert all(v == 1.0 for v in f[10:70])  # stable phase: independent of the total
    assert f[70] == pytest.approx(1.0) and f[99] < 0.06 and all(a >= b for a, b in zip(f[70:], f[71:]))
    assert module.lr_factor(50, 10, 100) == module.lr_factor(50, 10, 1000)


def test_a_mixed_reflow_stage_takes_its_share_of_rows_from_the_pairs_and_the_rest_from_fresh_scenes(tmp_path, capsys):
    """--reflow-fraction F: the first round(F x batch) rows of a step are the teacher's couplings (image, noise
    and caption of one pair together), the rest the fresh scenes pretraining would draw at that step. Bugs
    caught: a fraction that changes an all-pairs stage's batches (rD would no longer reproduce), fresh rows
    that reuse the pairs' noise or another step's scenes, and a fraction accepted without pairs or outside
    (0, 1]."""
    import json

    from safetensors.torch import save_file

    module = _pretrain_module()
    gen = torch.Generator().manual_seed(3)
    noise, images = torch.randn(8, 3, 32, 32, generator=gen), torch.rand(8, 3, 32, 32, generator=gen) * 2 - 1
    captions = [f"caption {i}" for i in range(8)]
    save_file({"noise": noise, "images": images}, str(tmp_path / "p.safetensors"),
              metadata={"captions": json.dumps(captions), "settings": "{}"})
    pairs = module.ReflowPairs([tmp_path / "p.safetensors"])

    whole = module.training_batch(0, 5, 4, 0.1, pairs, 1.0)
    for got, want in zip(whole, pairs.batch(0, 5, 4)):
        assert got == want if isinstance(got, list) else torch.equal(got, want)
    mixed = module.training_batch(0, 5, 4, 0.1, pairs, 0.5)
    rows, fresh = pairs.batch(0, 5, 2), module.make_batch(0, 5, 2, 0.1)
    for i, (got, a, b) in enumerate(zip(mixed, rows, fresh)):
        if i == 1:
            assert got == a + b
        else:
            assert torch.equal(got, torch.cat([a, b]))
    for k in range(2):  # the pair rows keep image, noise and caption of one coupling
        j = captions.index(mixed[1][k])
        assert torch.equal(mixed[0][k], images[j]) and torch.equal(mixed[2][k], noise[j])
    assert not torch.equal(mixed[2][2:], module.training_batch(0, 6, 4, 0.1, pairs, 0.5)[2][2:])
    assert torch.equal(module.training_batch(0, 5, 4, 0.1)[0], module.make_batch(0, 5, 4, 0.1)[0])

    for extra, message in ((["--reflow-fraction", "0.5"], "with --reflow-pairs"),
                           (["--reflow-pairs", str(tmp_path / "p.safetensors"), "--reflow-fraction", "1.5"],
                            "a share in (0, 1]"),
                           (["--reflow-pairs", str(tmp_path / "p.safetensors"), "--reflow-fraction", "0.1"],
                            "no pair in a batch of 4")):
        with pytest.raises(SystemExit):
            module.main(["--batch", "4", "--steps", "1", "--no-eval", "--workdir", str(tmp_path / "w"),
                         "--out", str(tmp_path / "o"), *extra])
        assert message in capsys.readouterr().err and not (tmp_path / "w").exists()


def _golden_batch():
    from solbench.engine.noise import seeded_normal

    by_skill: dict[str, list[str]] = {}
    for r in load_prompt_set("shapes/heldout"):
        by_skill.setdefault(r.skill, []).append(r.text)
    texts = [t for prompts in by_skill.values() for t in prompts[:2] for _ in range(2)]  # 4 skills x 2 x 2 seeds
    noise = torch.stack([seeded_normal(1000 + i, (3, 32, 32)) for i in range(len(texts))])
    return texts, noise


def test_shipped_velocity_golden_numbers(shipped):
    texts, noise = _golden_batch()
    tokens, pooled = shipped.encode(texts[:2])
    v = shipped.velocity(shipped.transformer, noise[:2], torch.tensor([0.5, 0.9]), tokens, pooled)
    assert v.abs().mean().item() == pytest.approx(1.19134, rel=1e-4)
    torch.testing.assert_close(v[0, 0, 0, :4], torch.tensor([0.12849, -0.71648, -0.08967, -0.29626]), atol=1e-4, rtol=0)
    torch.testing.assert_close(v[1, 2, 5, 10:13], torch.tensor([2.51837, 0.52726, 0.40821]), atol=1e-4, rtol=0)


@pytest.mark.parametrize("guidance, graded, strict", [(None, 0.4042, 5), (3.0, 0.4554, 8)])
def test_shipped_samples_golden_scores(shipped, guidance, graded, strict):
    # 10 Euler steps (the model's shift 3) from fixed noise on held-out prompts, judged by the detector. The strict count
    # may move by one image if a borderline detection flips on another CPU.
    texts, noise = _golden_batch()
    images = shipped.generate(texts, noise, steps=10, guidance=guidance)
    assert images.shape == (16, 3, 32, 32) and 0 <= images.min() and images.max() <= 1
    assert ShapesGenEval()(images, texts).mean().item() == pytest.approx(graded, abs=0.02)
    assert abs(ShapesGenEval(strict=True)(images, texts).sum().item() - strict) <= 1


def test_the_shipped_evaluation_record_is_what_evaluate_measures_on_the_shipped_weights(shipped):
    """solbench/assets/tiny_t2i_eval.json is the accuracy the README and docs quote. Bugs caught: weights replaced
    without re-evaluating them, and `evaluate` (solbench.measure.tiny_accuracy, shared by pretrain_tiny.py and
    measure_tiny.py) drifting from the settings the record was measured at (noise stream, seeds, shift, steps).
    Unguided only (a CFG row costs twice as much and tests the same wiring; the sampler's guidance has its own
    golden test above); a skill may move by one image where a borderline detection flips on another CPU."""
    from solbench.measure.tiny_accuracy import evaluate

    record = json.loads(tiny.asset_path("tiny_t2i_eval.json").read_text())
    got = evaluate(shipped, record["prompt_set"], seeds=record["seeds_per_prompt"], steps=record["steps"],
                   guidances=(None,), shift=record["shift"])
    assert got["shift"] == record["shift"] == shipped.config.shift
    prompts = load_prompt_set(record["prompt_set"])
    images_per_skill = {skill: record["seeds_per_prompt"] * sum(r.skill == skill for r in prompts)
                        for skill in {r.skill for r in prompts}}
    want, have = record["by_guidance"]["none"], got["by_guidance"]["none"]
    assert set(have["per_skill"]) == set(want["per_skill"])
    for skill, row in want["per_skill"].items():
        assert abs(have["per_skill"][skill]["strict"] - row["strict"]) <= 1.01 / images_per_skill[skill], skill
    assert have["accuracy"] == pytest.approx(want["accuracy"], abs=0.02)


def test_weight_perturbation_is_seeded_and_restores_the_clean_weights():
    # Bugs caught: noise that differs between a run and its resume (not a function of (seed, step)),
    # and a context that leaves the perturbed or NVFP4-rounded weights in place after the step.
    from solbench.quant import fake_quantize

    module = _pretrain_module()
    model = tiny.load_tiny(pretrained=False)
    weights = module.block_linear_weights(model)
    assert weights and all(w.dim() == 2 for w in weights)
    names = [n for n, m in model.transformer.named_modules() if any(m.weight is w for w in weights if hasattr(m, "weight"))]
    assert not any(n.endswith("proj_out") or n in ("x_embedder", "context_embedder") for n in names)
    clean = [w.detach().clone() for w in weights]
    with module.perturbed_weights(weights, 0.1, seed=3, step=7):
        first = [w.detach().clone() for w in weights]
    assert all(torch.equal(w, c) for w, c in zip(weights, clean))
    with module.perturbed_weights(weights, 0.1, seed=3, step=7):
        assert all(torch.equal(w, f) for w, f in zip(weights, first))
    rel = torch.stack([(f - c).norm() / c.norm() for f, c in zip(first, clean)])
    assert 0.07 < rel.mean().item() < 0.13  # sigma 0.1 relative
    with module.perturbed_weights(weights, 0.0, seed=3, step=7, nvfp4=True):
        assert all(torch.equal(w, fake_quantize(c, "nvfp4", (16, 16))) for w, c in zip(weights, clean))
    assert all(torch.equal(w, c) for w, c in zip(weights, clean))


@pytest.mark.slow
def test_second_stage_pretraining_from_weights_resumes_exactly(tmp_path):
    # Bug caught: --init-from / --nvfp4-every / --weight-noise runs that do not resume to the same
    # weights (the noise or the quantized steps drawn from state that a resume does not restore).
    module = _pretrain_module()
    _run(module, tmp_path / "stage1", "--steps", "2")
    extra = ("--init-from", str(tmp_path / "stage1"), "--weight-noise", "0.05", "--nvfp4-every", "2")
    straight = _run(module, tmp_path / "a", "--steps", "4", *extra)
    _run(module, tmp_path / "b", "--steps", "2", *extra)
    resumed = _run(module, tmp_path / "b", "--steps", "4", "--resume", *extra)
    for key in straight:
        assert torch.equal(straight[key], resumed[key]), key
    meta = json.loads((tmp_path / "a" / "tiny_t2i_train.json").read_text())
    assert meta["init_from"]["step"] == 2 and meta["nvfp4_every"] == 2 and meta["weight_noise"] == 0.05


def test_a_weights_folder_serves_as_the_tiny_model_with_its_own_sigma_shift(tmp_path, random_model, capsys):
    """Catches: model.path of a pretrained variant (scripts/pretrain_tiny.py --out DIR) being
    rejected or silently replaced by the shipped weights, and the variant's recorded sampling shift
    (tiny_t2i.json) not reaching the adapter's schedule."""
    from solbench.cli import main as cli
    from solbench.config import ModelConfig
    from solbench.models import build_adapter as build_model

    variant = copy.deepcopy(random_model)
    with torch.no_grad():
        variant.transformer.proj_out.bias.add_(0.25)  # differs from both the shipped and the random weights
    variant.config.shift = 2.0  # neither the shipped model's 3 nor the default 1
    folder = tmp_path / "tiny_variant"
    folder.mkdir()
    tiny.save_tiny(variant, folder / "tiny_t2i.safetensors", folder / "tiny_t2i.json")
    adapter = build_model(ModelConfig(name="tiny", path=str(folder)), device="cpu")
    torch.testing.assert_close(adapter.model.transformer.proj_out.bias, variant.transformer.proj_out.bias)
    assert adapter.default_shift == 2.0
    torch.testing.assert_close(adapter.sigmas(4), torch.tensor([1.0, 6 / 7, 2 / 3, 0.4, 0.0]))  # 2s / (1 + s)
    shipped = build_model(ModelConfig(name="tiny"), device="cpu")
    assert shipped.default_shift == 3.0  # the shipped v2 samples as SD3.5 and SANA do
    torch.testing.assert_close(shipped.sigmas(4), torch.tensor([1.0, 0.9, 0.75, 0.5, 0.0]))  # 3s / (1 + 2s)

    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: t\nbase: {{model: {{name: tiny, path: {folder}}}}}\nmatrix: {{method: [sol_rl]}}\n")
    assert cli(["expand", str(spec)]) == 0
    (folder / "tiny_t2i.json").unlink()
    assert cli(["expand", str(spec)]) == 2
    assert "lacks tiny_t2i.json" in capsys.readouterr().err
    with pytest.raises(MissingWeightsError, match="lacks tiny_t2i.json"):  # commands that skip expand
        build_model(ModelConfig(name="tiny", path=str(folder)), device="cpu")


def test_nvfp4_consistency_is_the_velocity_gap_to_the_rounded_copy_and_trains_the_clean_weights():
    """Catches: the consistency term of the shipped model's second stage measuring the wrong
    perturbation (other layers than the explore copy quantizes, or Gaussian noise when NVFP4 was
    asked for), leaving rounded weights in the model, or cutting the gradient to the clean weights
    (a detached straight-through path trains nothing)."""
    from solbench.quant import fake_quantize

    module = _pretrain_module()
    model = load_tiny(pretrained=False)
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(4, 3, 32, 32, generator=g), torch.rand(4, generator=g)
    tokens, pooled = model.encode(["a red circle", "two blue squares", "", "a green triangle"])
    clean = {k: v.clone() for k, v in model.state_dict().items()}
    v = model.velocity(model.transformer, x, t, tokens, pooled)
    gap = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, seed=0, step=0, kind="nvfp4")

    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for w in module.block_linear_weights(rounded):
            w.copy_(fake_quantize(w.detach(), "nvfp4", (16, 16)))
    v_rounded = rounded.velocity(rounded.transformer, x, t, tokens, pooled)
    assert gap.item() == pytest.approx(torch.nn.functional.mse_loss(v_rounded, v).item(), rel=1e-5)
    assert gap.item() > 0
    gaussian = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, seed=0, step=0)
    assert gaussian.item() != pytest.approx(gap.item(), rel=1e-3)
    # min_t: only samples with t >= min_t count (averaged over the whole batch), none above t = 1
    late = t >= 0.5
    assert 0 < late.sum() < len(t)
    per_sample = (v_rounded - v).pow(2).flatten(1).mean(1)
    masked = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", min_t=0.5)
    assert masked.item() == pytest.approx((per_sample * late).mean().item(), rel=1e-5)
    assert module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", min_t=1.1).item() == 0
    early = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", max_t=0.5)
    assert early.item() == pytest.approx((per_sample * ~late).mean().item(), rel=1e-5)

    gap.backward()
    assert all(torch.equal(model.state_dict()[k], clean[k]) for k in clean)  # nothing rounded in place
    grads = [w.grad for w in module.block_linear_weights(model)]
    assert all(gr is not None and gr.abs().sum() > 0 for gr in grads)
    assert model.transformer.proj_out.weight.grad.abs().sum() > 0  # the unquantized layers train too


def test_nvfp4_consistency_against_a_recipe_is_the_gap_to_that_recipes_explore_copy():
    """Catches: a consistency stage against an explore recipe (--consistency-recipe) that rounds other
    layers than the recipe's explore copy (the FLUX analogue also rounds attention and every proj_out),
    leaves out the W4A4 input rounding the copy applies, or keeps input hooks after the step.
    Oracle: the velocity of `quantized_copy(transformer, recipe)`, the explore copy itself."""
    from solbench.quant import get_recipe, quantized_copy

    module = _pretrain_module()
    model = load_tiny(pretrained=False)
    g = torch.Generator().manual_seed(1)
    x, t = torch.randn(4, 3, 32, 32, generator=g), torch.rand(4, generator=g)
    tokens, pooled = model.encode(["a red circle", "two blue squares", "", "a green triangle"])
    v = model.velocity(model.transformer, x, t, tokens, pooled)
    layers = module.recipe_linear_layers(model, "nvfp4_tiny_flux")
    assert len(layers) == 41 and "proj_out" in dict(layers) and "transformer_blocks.0.attn.to_q" in dict(layers)
    for recipe, weights_only in ((get_recipe("nvfp4_tiny_flux"), False), (get_recipe("nvfp4_tiny_flux"), True),
                                 (get_recipe("nvfp4_tiny"), False)):
        gap = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", recipe=recipe.name,
                                              weights_only=weights_only)
        explore = quantized_copy(model.transformer, recipe.replace(activations=not weights_only))
        with torch.no_grad():
            v_explore = model.velocity(explore, x, t, tokens, pooled)
        assert gap.item() == pytest.approx(torch.nn.functional.mse_loss(v_explore, v).item(), rel=1e-4), (recipe.name, weights_only)
    # --consistency-exclude proj_out: the term keeps that layer in full precision, every other one W4A4
    gap = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", recipe="nvfp4_tiny_flux",
                                          excluded=("proj_out",))
    flux = get_recipe("nvfp4_tiny_flux")
    explore = quantized_copy(model.transformer, flux.replace(skip=flux.skip + ("proj_out",)))
    with torch.no_grad():
        v_explore = model.velocity(explore, x, t, tokens, pooled)
    assert gap.item() == pytest.approx(torch.nn.functional.mse_loss(v_explore, v).item(), rel=1e-4)
    assert not any(m._forward_pre_hooks for m in model.transformer.modules())
    full = module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", recipe="nvfp4_tiny_flux")
    full.backward()
    assert all(m.weight.grad is not None and m.weight.grad.abs().sum() > 0 for _, m in layers)


def test_anchored_output_layer_is_pulled_towards_its_rounding_where_straight_through_cancels():
    """Catches: --consistency-anchor not reaching the output layer, or the straight-through term being
    relied on to shrink the final proj_out's rounding gap. For the layer whose output is the velocity,
    the two straight-through paths cancel (with proj_out the only rounded layer, weights only, its
    input is the same in both forwards and its weight's gradient is zero up to float error); anchored,
    its gradient is the clean path's alone and a small step along it shrinks the gap."""
    from solbench.quant import fake_quantize, get_recipe

    only_out = get_recipe("nvfp4_tiny_flux").replace(
        name="out_only", skip=get_recipe("nvfp4_tiny_flux").skip + ("transformer_blocks", "single_transformer_blocks"))
    module = _pretrain_module()
    assert [n for n, _ in module.recipe_linear_layers(load_tiny(pretrained=False), only_out)] == ["proj_out"]
    model = load_tiny(pretrained=False)
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(4, 3, 32, 32, generator=g), torch.rand(4, generator=g)
    w = model.transformer.proj_out.weight

    def gap(anchored=()):
        tokens, pooled = model.encode(["a red circle", "two blue squares", "", "a green triangle"])
        v = model.velocity(model.transformer, x, t, tokens, pooled)
        return module.perturbation_consistency(model, x, t, tokens, pooled, v, 0.11, 0, 0, "nvfp4", recipe=only_out,
                                               weights_only=True, anchored=anchored)

    gap().backward()
    assert w.grad.abs().max().item() < 1e-9 and model.transformer.norm_out.linear.weight.grad.abs().max() > 0
    model.zero_grad()
    before = gap(("proj_out",))
    before.backward()
    grad = w.grad.clone()
    assert grad.abs().max() > 0
    rounded = fake_quantize(w.detach(), "nvfp4", (16, 16))
    assert torch.sum(grad * (w.detach() - rounded)) > 0  # descent moves the weight towards its rounding
    with torch.no_grad():
        w.sub_(1e-3 * grad / grad.abs().max())
    assert gap(("proj_out",)).item() < before.item()


def test_committed_candidates_are_the_weights_their_readme_names_and_load_as_tiny_models():
    """candidates/README.md names each kept candidate's checksum and command; later stages start from these
    folders. Bugs caught: weights replaced or truncated without the README (a stage would continue another model
    than the docs say), a folder without the JSON a tiny model loads from, a README row for a missing folder."""
    import hashlib
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "candidates"
    rows = re.findall(r"^\| `([\w.-]+)/` \|.*\| `([0-9a-f]{64})` \|$", (root / "README.md").read_text(), re.M)
    assert rows, "candidates/README.md lists no candidate"
    for folder, digest in rows:
        weights = root / folder / "tiny_t2i.safetensors"
        assert hashlib.sha256(weights.read_bytes()).hexdigest() == digest, folder
        load_tiny(folder=root / folder)  # its JSON's architecture holds its weights (strict load)
    assert {f for f, _ in rows} == {p.name for p in root.iterdir() if p.is_dir()}
    # the README also names the shipped weights' checksum (the model the candidates led to)
    shipped = re.search(r"The shipped model .*?sha256 `([0-9a-f]{64})`", (root / "README.md").read_text(), re.S)
    assert shipped and shipped.group(1) == hashlib.sha256(tiny.asset_path("tiny_t2i.safetensors").read_bytes()).hexdigest()
