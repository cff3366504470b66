"""solbench.engine.noise: a candidate's noise is a pure function of (run seed, stream, prompt id, index)."""

import hashlib

import pytest
import torch

from solbench.engine.noise import candidate_noise, noise_seed, seeded_normal, step_noise

SHAPE = (3, 8, 8)


def test_seed_is_blake2b_of_the_key():
    key = b"7|train/3|prompt-12|5"
    expected = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & ((1 << 63) - 1)
    assert noise_seed(7, "train/3", "prompt-12", 5) == expected


def test_seeds_differ_across_every_key_component():
    base = noise_seed(0, "eval", "p", 0)
    assert len({base, noise_seed(1, "eval", "p", 0), noise_seed(0, "train/0", "p", 0),
                noise_seed(0, "eval", "q", 0), noise_seed(0, "eval", "p", 1)}) == 5


def test_candidate_noise_is_independent_of_batch_size_order_and_subset():
    ids = [f"p{i % 3}" for i in range(8)]
    cands = list(range(8))
    full, seeds = candidate_noise(0, "train/0", ids, cands, SHAPE)
    assert full.shape == (8, *SHAPE) and full.dtype == torch.float32
    for i in range(8):  # alone
        alone, s = candidate_noise(0, "train/0", [ids[i]], [cands[i]], SHAPE)
        assert torch.equal(alone[0], full[i]) and s == [seeds[i]]
    order = [5, 2, 7, 0]  # a reordered subset
    sub, sub_seeds = candidate_noise(0, "train/0", [ids[i] for i in order], [cands[i] for i in order], SHAPE)
    assert torch.equal(sub, full[order]) and sub_seeds == [seeds[i] for i in order]


def test_candidate_noise_is_standard_normal_and_distinct():
    noise, _ = candidate_noise(0, "eval", ["a"] * 4, [0, 1, 2, 3], (4096,))
    assert abs(noise.mean().item()) < 0.05 and abs(noise.std().item() - 1) < 0.05
    assert not torch.equal(noise[0], noise[1])


def test_candidate_noise_dtype_is_a_cast_of_the_float32_draw():
    f32, _ = candidate_noise(3, "eval", ["a"], [0], SHAPE)
    bf16, _ = candidate_noise(3, "eval", ["a"], [0], SHAPE, dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16 and torch.equal(bf16, f32.to(torch.bfloat16))
    assert torch.equal(f32[0], seeded_normal(noise_seed(3, "eval", "a", 0), SHAPE))


def test_candidate_noise_length_mismatch_and_empty():
    with pytest.raises(ValueError, match="differ in length"):
        candidate_noise(0, "eval", ["a", "b"], [0], SHAPE)
    empty, seeds = candidate_noise(0, "eval", [], [], SHAPE)
    assert empty.shape == (0, *SHAPE) and seeds == []


def test_step_noise_is_keyed_by_seed_and_step():
    a = step_noise([11, 12], 0, SHAPE)
    assert torch.equal(step_noise([12], 0, SHAPE)[0], a[1])  # batch-independent
    assert not torch.equal(step_noise([11], 1, SHAPE)[0], a[0])  # fresh per step
    assert not torch.equal(a[0], a[1])
    assert step_noise([], 0, SHAPE).shape == (0, *SHAPE)
