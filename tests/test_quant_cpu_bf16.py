"""The explore copy on the CPU's bf16 units (backend "cpu_bf16", solbench.quant.cpu_bf16).

What its numbers are held to: the NVFP4 / FP8 codes and block and per-tensor scales of its input
quantizer are formats.quantize's bit for bit (compiled and eager paths); its weight values are the
emulated layer's weight with the per-tensor scale factored out, bit for bit; its output is the
emulated layer's within the bound the module states (bf16 output rounding + summation order); a
quantized copy of the tiny model on it replaces the same layers as the emulated copy, refreshes on
sync_weights, and shares one quantizer pass between siblings with bit-identical results. And how it
is chosen: ``auto`` takes it only on a CPU with bf16 units, expansion writes the choice into the run
config (so run ids change only where the numbers do), and a run records it in explore.json.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from solbench import quant
from solbench.machine import cpu
from solbench.quant import formats, fused, registry
from solbench.quant.backends import choose_backend, resolve_on_cpu
from solbench.quant.cpu_bf16 import CpuBf16Linear, quantize_fp8_bf16_rows, quantize_nvfp4_bf16_rows, weight_values

GOLDEN = [0.1, -0.3, 0.9, 1.3, -2.2, 2.9, 3.6, 5.2, 7.0, -0.0, 0.0, 1e-9, -4.4, 0.74, 0.76, 2.6]


def _inputs():
    torch.manual_seed(0)
    yield torch.randn(48, 64)
    outlier = torch.randn(16, 32)
    outlier[3, 5] = 1e4  # most blocks get subnormal E4M3 scales
    yield outlier
    yield torch.zeros(16, 32)  # all zero: unit global scale
    yield torch.randn(16, 32) * 1e-30  # tiny global amax
    yield torch.tensor([GOLDEN, GOLDEN])
    yield torch.randn(512, 256) * 3  # 131072 elements: the compiled kernel's size (fused.MIN_ELEMENTS)


def _e2m1(codes: torch.Tensor) -> torch.Tensor:
    table = formats.E2M1_VALUES
    return torch.stack([table[(codes & 15).long()], table[(codes >> 4).long()]], dim=-1).view(codes.shape[0], -1)


@pytest.mark.parametrize("compiled", [True, False])
def test_nvfp4_input_values_are_the_codes_times_block_scales_of_quantize(compiled, monkeypatch):
    """Catches a quantizer that drifts from TE's arithmetic (a block scale rounded otherwise, a tie broken
    the other way, the global scale from another formula): every bf16 value must be exactly
    e2m1(code) x E4M3 block scale of formats.quantize, and the decode scale its S_dec, on both paths."""
    if not compiled:
        monkeypatch.setattr(fused, "MIN_ELEMENTS", 1 << 40)
    for x in _inputs():
        values, decode = quantize_nvfp4_bf16_rows(x)
        ref = formats.quantize(x, "nvfp4", (1, 16))
        expected = (_e2m1(ref.codes).view(x.shape[0], -1, 16) * ref.scales.float()[..., None]).view(x.shape)
        assert values.dtype == torch.bfloat16 and values.shape == x.shape
        assert torch.equal(values.float(), expected), "values are not e2m1 x block scale"
        assert torch.equal(expected.bfloat16().float(), expected)  # exact in bf16, as the module claims
        assert float(decode) == formats._nvfp4_global_scales(float(ref.global_amax))[1]
        # and they reconstruct the emulated input (one fp32 rounding apart at most)
        torch.testing.assert_close(values.float() * decode, formats.fake_quantize(x, "nvfp4", (1, 16)),
                                   rtol=2 ** -23, atol=0)


def test_fp8_input_values_are_the_e4m3_codes_of_quantize():
    """FP8 E4M3 per tensor: the bf16 values are the codes of formats.quantize (scale factored out) exactly."""
    for x in _inputs():
        values, decode = quantize_fp8_bf16_rows(x)
        ref = formats.quantize(x, "fp8", None)
        assert torch.equal(values.float(), ref.codes.view(torch.float8_e4m3fn).float().view(x.shape))
        assert float(decode) == float(ref.scales)


@pytest.mark.parametrize("recipe_name", ["nvfp4_w4a4", "fp8_w8a8"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nonfinite_input_is_refused_naming_the_layer(recipe_name, bad):
    """Catches a NaN or inf input quantized into garbage codes silently (the emulated path raises, so must this)."""
    layer = CpuBf16Linear(32, 16, False, quant.get_recipe(recipe_name), name="blocks.0.ff")
    layer.load_weight(torch.randn(16, 32))
    x = torch.randn(4, 32)
    x[1, 3] = bad
    with pytest.raises(quant.NonFiniteError, match="blocks.0.ff"):
        layer(x)


@pytest.mark.parametrize("recipe_name,block", [("nvfp4_w4a4", (16, 16)), ("fp8_w8a8", None)])
def test_layer_output_is_the_emulated_layers_within_the_stated_bound(recipe_name, block):
    """The bound of the module docstring: |y - y_emulated| <= 2^-8 |y_emulated| + 2^-16 (|Xv| @ |Wv|^T) S_x S_w.
    Catches a wrong scale (S_w applied twice, a block scale missing: errors of order 1), weights not the
    emulated layer's (checked bit for bit), and a bias dropped or added twice."""
    torch.manual_seed(3)
    linear = torch.nn.Linear(256, 96)
    recipe = quant.get_recipe(recipe_name)
    emulated = quant.QuantLinear.from_linear(linear, recipe, name="l")
    layer = CpuBf16Linear(256, 96, True, recipe, name="l")
    layer.load_weight(linear.weight, linear.bias)
    assert torch.equal(layer.dequantized_weight(), emulated.weight)  # weight values x S_w == emulated weight
    q = formats.quantize(linear.weight.detach(), recipe.format, block)
    assert torch.equal(layer.values, weight_values(q))
    x = torch.randn(3, 40, 256) * 2
    with torch.no_grad():
        out, ref = layer(x), emulated(x)
        xv, sx = layer.quantize_input(x)
    assert out.shape == ref.shape == (3, 40, 96) and out.dtype == torch.float32
    magnitude = (xv.float().abs() @ layer.values.float().abs().t() * (sx * layer.decode)).view(3, 40, 96)
    bound = 2.0 ** -8 * ref.abs() + 2.0 ** -16 * magnitude
    assert bool(((out - ref).abs() <= bound).all())
    assert float((out - ref).abs().max()) > 0  # the bf16 output rounding is there: the test compares two paths


def test_tiny_model_copy_replaces_the_emulated_copys_layers_shares_inputs_and_syncs():
    """A copy of the shipped tiny model on cpu_bf16: the same layers quantized as on the emulated backend
    (catches a selection rule that differs between backends: the FLOP split would then price the wrong
    layers), one quantizer pass shared by q/k/v with bit-identical output (catches a cache returning
    another tensor's values), and sync_weights re-quantizing to a fresh copy's state."""
    from solbench.models.tiny import load_tiny
    from solbench.models.tiny_adapter import TinyAdapter

    model = load_tiny(pretrained=True)
    adapter = TinyAdapter(model)
    policy = adapter.transformer
    recipe = quant.recipe_for_model("nvfp4_tiny_flux", policy)
    emulated = quant.quantized_copy(policy, recipe)
    shared = quant.quantized_copy(policy, recipe, backend="cpu_bf16")
    alone = quant.quantized_copy(policy, recipe, backend="cpu_bf16", share_input_quantization=False)
    rows = [(r.name, r.quantized) for r in quant.quantization_summary(emulated)]
    assert [(r.name, r.quantized) for r in quant.quantization_summary(shared)] == rows
    assert sum(q for _, q in rows) == 41
    assert sum(isinstance(m, CpuBf16Linear) for m in shared.modules()) == 41
    cond = adapter.encode(["three red circles", "a blue square"] * 2)
    x, t = torch.randn(4, *adapter.latent_shape), torch.full((4,), 0.7)
    with torch.no_grad():
        a = model.velocity(shared, x, t, cond["tokens"], cond["pooled"])
        b = model.velocity(alone, x, t, cond["tokens"], cond["pooled"])
        e = model.velocity(emulated, x, t, cond["tokens"], cond["pooled"])
    assert torch.equal(a, b)
    assert float((a - e).norm() / e.norm()) < 0.1  # quantization flips downstream; far below the 1.0 of a wrong copy
    with torch.no_grad():
        for p in policy.parameters():
            p.mul_(0.9)
        quant.sync_weights(shared, policy)
        fresh = quant.quantized_copy(policy, recipe, backend="cpu_bf16")
        assert torch.equal(model.velocity(shared, x, t, cond["tokens"], cond["pooled"]),
                           model.velocity(fresh, x, t, cond["tokens"], cond["pooled"]))


def test_auto_takes_cpu_bf16_only_where_the_cpu_has_bf16_units(monkeypatch):
    """Catches auto exploring on bf16 GEMMs on a CPU that emulates them (slower than fp32) and auto never
    taking the fast path where it exists; explicit cpu_bf16 runs anywhere on CPU; recipes it cannot run say why."""
    recipe = quant.get_recipe("nvfp4_tiny_flux")
    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: True)
    chosen = choose_backend(recipe, "auto", device="cpu")
    assert chosen.backend == "cpu_bf16" and set(chosen.passed_over) == {"te", "torch"}
    weight_only = choose_backend(quant.get_recipe("nvfp4_w4a16"), "auto", device="cpu", allow_emulated_fallback=True)
    assert weight_only.backend == "emulated" and "weight-only" in weight_only.passed_over["cpu_bf16"]
    mx = choose_backend(quant.get_recipe("mxfp4_w4a4"), "auto", device="cpu", allow_emulated_fallback=True)
    assert mx.backend == "emulated" and "mxfp4 runs emulated" in mx.passed_over["cpu_bf16"]
    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: False)
    registry.clear_cache()  # the machine changed under the registry, which decides availability once per process
    none = choose_backend(recipe, "auto", device="cpu", allow_emulated_fallback=True)
    assert none.backend == "emulated" and "no bf16 units" in none.passed_over["cpu_bf16"]
    with pytest.raises(quant.BackendUnavailableError, match="cpu_bf16: this CPU has no bf16 units"):
        choose_backend(recipe, "auto", device="cpu")
    assert choose_backend(recipe, "cpu_bf16", device="cpu").backend == "cpu_bf16"


@pytest.mark.parametrize("bf16_units", [True, False])
def test_expansion_writes_the_cpu_backend_so_run_ids_change_only_where_numbers_do(bf16_units, monkeypatch, tmp_path):
    """tiny_main says backend auto with the emulated fallback. Expanded on a CPU without bf16 units its runs
    must hash exactly as the former ``backend: emulated`` spec's (their results stay valid); with bf16 units
    the explore methods' ids (and only theirs) change, and their config says cpu_bf16. Catches a resolution
    that leaves 'auto' in the hash (every id changes) or resolves at run time only (ids that hide the backend)."""
    from solbench.spec import load_spec as expand_spec

    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: bf16_units)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    text = (_repo() / "experiments" / "tiny_main.yaml").read_text()
    assert "backend: auto, allow_emulated_fallback: true" in text
    old = tmp_path / "old.yaml"
    old.write_text(text.replace("backend: auto, allow_emulated_fallback: true", "backend: emulated"))
    new = tmp_path / "new.yaml"
    new.write_text(text)
    before = {(r.config.method, r.config.seed): r.config for r in expand_spec(old).runs}
    after = {(r.config.method, r.config.seed): r.config for r in expand_spec(new).runs}
    for key, cfg in after.items():
        explores = key[0] in ("sol_rl", "naive_fp4")
        if bf16_units and explores:
            assert cfg.quant.backend == "cpu_bf16" and cfg.run_id != before[key].run_id
        else:
            assert cfg.quant.backend == "emulated" and cfg.run_id == before[key].run_id


def test_resolution_leaves_gpu_runs_to_run_time(monkeypatch):
    """A real model's spec (device cuda) keeps 'auto' (resolved on the GPU node by choose_backend)."""
    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: True)
    q = {"recipe": "nvfp4_flux", "backend": "auto", "allow_emulated_fallback": False}
    resolve_on_cpu(q, "cuda", "flux")
    assert q["backend"] == "auto"
    resolve_on_cpu(q, "cpu", "flux")
    assert q["backend"] == "cpu_bf16"


def test_the_trainer_records_cpu_bf16_in_explore_json(tmp_path, monkeypatch):
    """The run folder says its explore copy computed on the bf16 units (the report labels Table 5 by it)."""
    from solbench.config import RunConfig
    from solbench.results import RunStore
    from solbench.train.trainer import Trainer

    monkeypatch.setattr(cpu, "native_bf16", lambda cpuinfo=None: True)
    cfg = RunConfig(method="naive_fp4", method_config={"n": 4, "k": 2}, prompts_per_iter=1, iterations=1, device="cpu")
    cfg.model.path = "random"
    cfg.quant.backend = "cpu_bf16"
    store = RunStore(tmp_path / cfg.run_id, cfg.run_id)
    trainer = Trainer(cfg, store)
    record = json.loads((tmp_path / cfg.run_id / "explore.json").read_text())
    assert record["backend"] == "cpu_bf16" and record["recipe"] == "nvfp4_tiny_flux"
    assert any(isinstance(m, CpuBf16Linear) for m in trainer.nets.get("explore").modules())


def _repo():
    from pathlib import Path

    return Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("recipe,expected", [("nvfp4_tiny_flux", "cpu_bf16"), ("mxfp4_w4a4", "emulated"),
                                             ("none", "cpu_bf16")])
def test_fidelity_of_a_cpu_bf16_run_keeps_its_backend_where_it_runs_the_recipe(recipe, expected):
    """`solbench fidelity --checkpoint` of a run that explored on cpu_bf16 measures on cpu_bf16, and a recipe
    the backend cannot run (tiny_paper's MXFP4 rows) on emulation, as the run's auto would have, instead of
    failing. Catches a fidelity block that stops at its first MXFP4 recipe."""
    from types import SimpleNamespace

    from solbench.config import RunConfig
    from solbench.fidelity.experiment import FidelitySettings, resolve

    run = RunConfig(method="sol_rl", device="cpu")
    run.quant.backend = "cpu_bf16"
    checkpoint = SimpleNamespace(config=run, state={"nets": {"trainable": {"policy": {}}}}, path="x/step_1.pt",
                                 run_id="abc", step=1)
    spec = resolve(FidelitySettings(recipe=recipe, device="cpu"), checkpoint)
    assert spec["quant"]["backend"] == expected
    explicit = resolve(FidelitySettings(recipe="nvfp4_tiny_flux", backend="emulated", device="cpu"), checkpoint)
    assert explicit["quant"]["backend"] == "emulated"
