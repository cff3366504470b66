"""The registry of quantization backends (solbench.quant.registry): one record per backend that expansion, trainer
setup, quantized_copy and the run facts all read, availability decided once per process, and a backend registered
from outside (here, a test) picked up by all of them with no other file edited."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from solbench import quant
from solbench.errors import ConfigError
from solbench.quant import registry
from solbench.quant.backends import choose_backend
from solbench.quant.registry import Backend, UnknownBackendError


def test_every_backend_says_its_name_label_availability_factory_and_units():
    """Catches a backend missing one of the things generic code asks about it: name, words for the report, whether
    it computes on low-precision units, availability with a reason for every recipe, and a layer factory."""
    names = registry.backend_names()
    assert set(names) >= {"emulated", "te", "torch", "cpu_bf16"}
    for name in names:
        backend = registry.get_backend(name)
        assert backend.name == name and backend.label and isinstance(backend.low_precision, bool)
        assert callable(backend.make_layer) and backend.layer_types
        for recipe in quant.RECIPES.values():
            reason = registry.unavailable_reason(name, recipe, "cpu")
            assert reason is None or (isinstance(reason, str) and reason)
    assert registry.fallback().name == "emulated" and not registry.get_backend("emulated").low_precision
    assert registry.unavailable_reason("emulated", quant.get_recipe("mxfp4_w4a4")) is None  # runs anywhere
    assert {registry.get_backend(n).low_precision for n in ("te", "torch", "cpu_bf16")} == {True}
    assert registry.auto_order() == ("te", "torch", "cpu_bf16")


def test_an_unknown_backend_name_gets_a_did_you_mean_at_lookup_and_at_expansion(tmp_path):
    """Catches a typo'd quant.backend failing without naming the backend meant (or not failing until run time)."""
    with pytest.raises(UnknownBackendError, match="did you mean 'cpu_bf16'"):
        registry.get_backend("cpu_bf61")
    with pytest.raises(ValueError, match="did you mean 'torch'"):
        choose_backend(quant.get_recipe("fp8_w8a8"), "torhc")
    with pytest.raises(ConfigError, match=r"quant.backend.*must be emulated, te, torch, cpu_bf16 or auto, got 'torhc'; "
                                          r"did you mean 'torch'\?"):
        _expand(tmp_path, "torhc")


def test_availability_is_decided_once_per_process(monkeypatch):
    """Catches expansion, trainer setup and quantized_copy each deciding anew (three probes of TE, three answers
    where the machine is flaky): the registry asks a backend once per recipe and device and remembers."""
    calls = []
    real = quant.layers.te_unavailable_reason
    monkeypatch.setattr(quant.layers, "te_unavailable_reason", lambda recipe: calls.append(recipe.name) or real(recipe))
    recipe = quant.get_recipe("fp8_w8a8")
    for _ in range(3):
        registry.unavailable_reason("te", recipe, "cpu")
    choose_backend(recipe, "te", allow_emulated_fallback=True, device="cpu")
    assert calls == ["fp8_w8a8"]
    registry.clear_cache()
    registry.unavailable_reason("te", recipe, "cpu")
    assert calls == ["fp8_w8a8", "fp8_w8a8"]


# --- a backend registered from outside ---------------------------------------------------------------------------


class _FakeLinear(nn.Module):
    """A test backend's layer: the weight rounded to bf16 (a stand-in for some new format's kernels)."""

    def __init__(self, linear, recipe, *, name, weight, bias):
        super().__init__()
        self.name, self.recipe = name, recipe
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.empty_like(weight, device=weight.device))
        self.register_buffer("bias", None if bias is None else torch.empty_like(bias))
        self.load_weight(weight, bias)

    @torch.no_grad()
    def load_weight(self, weight, bias=None):
        self.weight.copy_(weight.to(torch.bfloat16).to(weight.dtype))
        if bias is not None:
            self.bias.copy_(bias)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _fake_unavailable(recipe, device, capability, auto):
    if recipe.format != "nvfp4":
        return "the fake backend runs NVFP4 only"
    if device is not None and torch.device(device).type != "cpu":
        return "the fake backend runs on the CPU"
    return None


@pytest.fixture
def fake_backend():
    backend = registry.register(Backend(
        "fake_bf16", "fake backend (a test's)", low_precision=True, unavailable=_fake_unavailable,
        make_layer=lambda linear, recipe, *, name, shared_inputs, weight, bias: _FakeLinear(
            linear, recipe, name=name, weight=weight, bias=bias),
        layer_types=(_FakeLinear,), feature_multiple=8, auto_rank=-1, device_types=("cpu",)))
    yield backend
    registry.unregister(backend.name)


def _expand(tmp_path, backend: str, *, device: str = "cpu", recipe: str = "nvfp4_tiny_flux"):
    from solbench.spec import load_spec

    path = tmp_path / f"spec_{backend}_{recipe}.yaml"
    path.write_text(textwrap.dedent(f"""
        name: t
        base:
          model: {{name: tiny}}
          device: {device}
          rewards: {{shapes_geneval: 1.0}}
          prompts_per_iter: 4
          iterations: 3
          eval: {{every: 1, prompts: shapes/eval, n_prompts: 2, seeds_per_prompt: 1, rewards: [shapes_geneval]}}
          quant: {{recipe: {recipe}, backend: {backend}}}
        matrix:
          method: [sol_rl]
          seed: [0]
    """))
    return load_spec(path)


def test_a_registered_backend_is_picked_up_by_expansion_setup_quantized_copy_and_facts(fake_backend, tmp_path):
    """A backend registered with one call (here, in a test; no other file edited) is accepted by expansion, taken by
    auto where it ranks first and runs the recipe, built by quantized_copy and the trainer's explore factory,
    refreshed by sync_weights, and recorded in the run facts the report labels backends by. Catches a backend name
    or rule still written out in the resolver, the trainer setup, quantized_copy or the facts."""
    from solbench.config import QuantConfig
    from solbench.train.setup import quant_explore_fns

    explicit = _expand(tmp_path, "fake_bf16").runs[0].config
    assert explicit.quant.backend == "fake_bf16"
    # auto on this CPU: the fake backend ranks before te/torch/cpu_bf16 and runs NVFP4 here, so expansion writes it
    assert _expand(tmp_path, "auto").runs[0].config.quant.backend == "fake_bf16"
    # a recipe it cannot run: auto goes on down its order (the fallback where allowed), as for any backend
    assert _expand(tmp_path, "auto", recipe="mxfp4_tiny_flux").runs[0].config.quant.backend != "fake_bf16"

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 12))  # 12 out features: not a multiple of 8
    copy = quant.quantized_copy(model, "nvfp4_w4a4", backend="fake_bf16")
    assert isinstance(copy[0], _FakeLinear) and isinstance(copy[2], nn.Linear)
    rows = quant.quantization_summary(copy)
    assert rows[0].quantized and "backend fake_bf16 needs in/out features divisible by 8" in rows[1].reason
    with torch.no_grad():
        model[0].weight.mul_(-1)
        quant.sync_weights(copy, model)
        assert torch.equal(copy[0].weight, model[0].weight.to(torch.bfloat16).float())
    with pytest.raises(quant.BackendUnavailableError, match="recipe 'fp8_w8a8', backend 'fake_bf16': the fake backend "
                                                            "runs NVFP4 only"):
        quant.quantized_copy(model, "fp8_w8a8", backend="fake_bf16")

    factory, _ = quant_explore_fns(QuantConfig(recipe="nvfp4_w4a4", backend="auto", allow_emulated_fallback=False))
    explore = factory(model)
    assert factory.choice.backend == "fake_bf16" and isinstance(explore[0], _FakeLinear)

    from solbench.train.facts import run_facts

    facts = run_facts(explicit.to_dict(), explores=True)
    backends = json.loads(facts["fact_quant_backends"])
    assert backends["fake_bf16"] == {"label": "fake backend (a test's)", "low_precision": True}
    assert backends["emulated"]["low_precision"] is False


def test_the_report_reads_backends_from_the_runs_facts_and_older_results_keep_their_words():
    """The report names a backend and judges its clock from what the runs recorded (``fact_quant_backends``), never
    from the registry: a backend registered after the report was written is labelled and counted as low-precision
    by its record; results collected before the fact keep the words they always had. Catches a report that spells
    the backends itself (a new one printed as 'x backend' and judged emulated)."""
    import pandas as pd

    from solbench.report.explore import backend_label, explore_text, on_low_precision_units, stored_backends
    from solbench.results.stored_facts import BACKENDS_FACT, FACTS_SCHEMA, SCHEMA_COLUMN
    from solbench.train.facts import quant_backends_fact

    recorded = json.loads(quant_backends_fact())
    recorded["npu_fp4"] = {"label": "NPU FP4 backend (a later one)", "low_precision": True}
    runs = pd.DataFrame({"run_id": ["a"], "p_quant.recipe": ["nvfp4_tiny_flux"], "p_quant.backend": ["npu_fp4"],
                         "fact_explore_format": ["nvfp4"], BACKENDS_FACT: [json.dumps(recorded)],
                         SCHEMA_COLUMN: [FACTS_SCHEMA]})
    assert explore_text(runs) == "NVFP4 (nvfp4_tiny_flux), NPU FP4 backend (a later one)"
    assert on_low_precision_units(runs)
    older = runs.drop(columns=[BACKENDS_FACT])
    assert explore_text(older) == "NVFP4 (nvfp4_tiny_flux), npu_fp4 backend" and not on_low_precision_units(older)
    # the older results' words are the registry's at the time the fact was added, so the reports read the same
    for name in ("emulated", "te", "torch", "cpu_bf16", "auto"):
        assert backend_label(name) == backend_label(name, stored_backends(runs)) == recorded[name]["label"]
        assert bool(stored_backends(None)[name]["low_precision"]) == bool(recorded[name]["low_precision"])
