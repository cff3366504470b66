"""The doctor's activation model: measured on the real diffusers blocks (solbench.models.activations reads the
shipped profiles, solbench.measure.activation_probe measures them with each model card's probe).

The shipped profiles (solbench/models/published/activations.json) must be what measuring the modules
gives now; a diffusers upgrade that changes what a block keeps fails here until the file is re-measured
(`python -m solbench.measure.activation_probe`).
"""

from __future__ import annotations

import json

import pytest
import torch

from solbench import doctor
from solbench.measure import activation_probe
from solbench.models import activations


@pytest.mark.parametrize("model", sorted(activations.PROBES))
def test_shipped_profiles_are_what_the_modules_save(model):
    shipped = json.loads(activations.PROFILE_FILE.read_text())["models"][model]
    assert activation_probe.measure(model) == shipped


class _AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1  # saves nothing for the backward


class _Chain(torch.nn.Module):
    """Each block gets a fresh copy of the running tensor, freed as soon as the block returns: the
    allocator hands its storage's address to the next block's copy."""

    def __init__(self, n):
        super().__init__()
        self.blocks = torch.nn.ModuleList(_AddOne() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x * 1.0)
        return x


def test_every_block_input_is_counted_even_when_a_freed_one_shared_its_address():
    """Bug: storages were told apart by address alone, so a block input allocated where a freed one had
    been counted as already seen: the FLUX single block's inputs measured [1.5, 2.5, -44.0] widths on CI
    instead of [1.0, 1.0, 0.0], and test_shipped_profiles_are_what_the_modules_save failed on one machine
    and passed on another."""
    x = torch.randn(1, 64, 32)
    counts = activation_probe._count(_Chain(6), {"x": x})
    assert [c["inputs"] for c in counts.values()] == [x.untyped_storage().nbytes()] * 6


def test_sana_training_activations_follow_its_blocks_saved_tensors():
    """Bug: the doctor assumed 10 hidden widths x 1.5 per token per block for every model. diffusers'
    SANA block keeps far more for its backward (the linear-attention processor's fp32 q/k/v with the
    padded value, GLUMBConv's two 5600-channel tensors, fp32 copies of the LoRA layers' inputs): measured,
    about 56 widths per image token. sana_main's FlowGRPO run (16 samples x 2 CFG forwards at 1024 px,
    no gradient checkpointing) needs about 175 GB of activations, not the 44 GB the doctor printed, and
    does not fit a 180 GB B200."""
    block = activations.PROFILES["sana"].blocks[0]
    assert block.count == 20 and block.saved[0] > 45
    profile = doctor.MemoryProfile(model="sana", resolution=1024, rollout=32, reward=32, train=16, cfg=True,
                                   gradient_checkpointing=False)
    items = dict((name.split(":")[0], gb) for name, gb in doctor.memory_items(profile))
    saved = 20 * activations.block_bytes(block.saved, 2240, 1024, 300)  # every block's, per sample-forward
    working = activations.block_bytes(block.peak, 2240, 1024, 300)  # plus one block's working set
    assert items["activations/train"] == pytest.approx(16 * 2 * (saved + working) / 1e9, abs=0.1)
    assert items["activations/train"] > 150
    checkpointed = dict((name.split(":")[0], gb) for name, gb in doctor.memory_items(
        doctor.dataclasses.replace(profile, gradient_checkpointing=True)))
    assert checkpointed["activations/train"] < items["activations/train"] / 10  # the setting that fits


def test_every_real_model_has_a_profile_for_the_doctor():
    assert set(activations.PROBES) == set(doctor.MODEL_WEIGHTS) == set(activations.TEXT_TOKENS)
    for model in doctor.MODEL_WEIGHTS:
        prof = activations.PROFILES[model]
        assert prof.width == doctor.MODEL_WEIGHTS[model].hidden
        assert sum(b.count for b in prof.blocks) == doctor.MODEL_WEIGHTS[model].blocks
