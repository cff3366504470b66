"""The method registry, config validation, advantages and selection (no model involved)."""

from __future__ import annotations

import dataclasses
import math
from importlib.metadata import EntryPoint

import pytest
import torch

import solbench.method as method_module
from solbench.method.advantages import group_advantages
from solbench.errors import ConfigError
from solbench.method import Method, get_method, method_names, validate_method_config
from solbench.method.selection import select_indices, select_per_group

BUILTIN = ["awm", "dance_grpo", "diffusion_nft", "flow_grpo", "naive_fp4", "naive_scaling", "sol_rl"]


# -- registry -----------------------------------------------------------------------------------
def test_builtin_methods_are_registered():
    assert set(BUILTIN) <= set(method_names())


@pytest.mark.parametrize("name", BUILTIN)
def test_every_config_field_has_help_and_axes_are_fields(name):
    cls = get_method(name)
    fields = {f.name: f for f in dataclasses.fields(cls.Config)}
    assert all(f.metadata.get("help") for f in fields.values()), [n for n, f in fields.items() if not f.metadata.get("help")]
    assert set(cls.axes) <= set(fields)
    assert validate_method_config(name, {}) == cls.Config()


def test_paper_defaults():
    sol = get_method("sol_rl").Config()
    assert (sol.n, sol.k, sol.explore_steps, sol.selection) == (96, 24, 6, "best_worst")
    assert (sol.beta, sol.kl_beta, sol.old_decay_rate, sol.old_decay_max) == (1.0, 1e-4, 0.001, 0.5)
    grpo = get_method("flow_grpo").Config()
    assert (grpo.group_size, grpo.clip_range, grpo.noise_level, grpo.kl_beta, grpo.timestep_fraction) == (24, 1e-4, 0.7, 0.04, 0.99)
    dance = get_method("dance_grpo").Config()
    assert (dance.group_size, dance.eta, dance.shift, dance.timestep_fraction, dance.shared_noise) == (12, 0.3, 3.0, 0.6, True)
    awm = get_method("awm").Config()
    assert (awm.group_size, awm.sampler, awm.noise_level, awm.train_timesteps, awm.timestep_fraction) == (
        24, "awm_sde", 0.4, 6, 0.9)
    assert (awm.adv_clip, awm.advantage_max, awm.global_std, awm.kl_beta, awm.slow_beta) == (5.0, 1.0, True, 1e-3, 1.0)
    assert (awm.slow_decay_rate, awm.slow_decay_max, awm.micro_batch_size) == (0.001, 0.3, None)
    nft = get_method("diffusion_nft").Config()
    assert (nft.group_size, nft.beta, nft.kl_beta, nft.adv_clip, nft.loss_scale, nft.global_std) == (24, 1.0, 1e-4, 5.0, 5.0, True)
    assert (nft.timestep_fraction, nft.sampler, nft.micro_batch_size) == (0.99, "dpm2", None)
    assert (grpo.sampler, grpo.adv_clip, grpo.global_std, grpo.same_latent) == ("flowgrpo_sde", 5.0, True, False)
    assert (dance.clip_range, dance.adv_clip, dance.micro_batch_size) == (1e-4, 5.0, None)
    assert get_method("sol_rl").nets == {"old", "reference", "explore"}
    assert "explore" not in get_method("naive_scaling").nets


def test_unknown_method_suggests_close_names():
    with pytest.raises(ConfigError, match="did you mean 'sol_rl'"):
        get_method("sol-rl")
    with pytest.raises(ConfigError, match="unknown method 'zzz'"):
        get_method("zzz")


@pytest.mark.parametrize("values,message", [
    ({"nn": 8}, "unknown field.*'nn' \\(did you mean 'n'\\?\\)"),
    ({"k": "24"}, "method_config.k: expected an integer"),
    ({"k": True}, "method_config.k: expected an integer"),
    ({"selection": "best_wrst"}, "did you mean 'best_worst'"),
    ({"k": 100}, "need 2 <= k <= n"),
    ({"global_std": 1}, "expected true/false"),
])
def test_invalid_method_config_fails_clearly(values, message):
    with pytest.raises(ConfigError, match=message):
        validate_method_config("sol_rl", values)


# (method, field, smallest valid value, largest invalid value): each Config's checks at their boundary
BOUNDARIES = [
    ("sol_rl", "explore_steps", 1, 0), ("sol_rl", "k", 2, 1), ("sol_rl", "beta", 1e-6, 0.0),
    ("sol_rl", "timestep_fraction", 1e-3, 0.0), ("diffusion_nft", "group_size", 2, 1),
    ("diffusion_nft", "micro_batch_size", 1, 0), ("flow_grpo", "group_size", 2, 1),
    ("flow_grpo", "noise_level", 1e-3, 0.0), ("dance_grpo", "eta", 1e-3, 0.0), ("dance_grpo", "group_size", 2, 1),
    ("awm", "train_timesteps", 1, 0), ("awm", "group_size", 2, 1), ("awm", "timestep_fraction", 1e-3, 0.0),
    ("flow_grpo", "timestep_fraction", 1e-3, 0.0), ("dance_grpo", "timestep_fraction", 1e-3, 0.0),
]


@pytest.mark.parametrize("name,field,valid,invalid", BOUNDARIES)
def test_config_checks_sit_at_their_boundaries(name, field, valid, invalid):
    """Catches an off-by-one in a Config check (e.g. explore_steps <= 1 rejecting the valid 1)."""
    assert getattr(validate_method_config(name, {field: valid}), field) == valid
    with pytest.raises(ConfigError, match=field):
        validate_method_config(name, {field: invalid})
    if field == "timestep_fraction":
        assert validate_method_config(name, {field: 1.0}).timestep_fraction == 1.0
        with pytest.raises(ConfigError, match=field):
            validate_method_config(name, {field: 1.01})


def test_valid_overrides_are_coerced():
    cfg = validate_method_config("sol_rl", {"n": 8, "k": 4, "beta": 1, "micro_batch_size": None})
    assert (cfg.n, cfg.k, cfg.beta, cfg.micro_batch_size) == (8, 4, 1.0, None)
    assert isinstance(cfg.beta, float)


@dataclasses.dataclass
class OutsideConfig:
    lr_scale: float = dataclasses.field(default=1.0, metadata={"help": "a knob"})


class OutsideMethod(Method):
    name = "outside_method"
    Config = OutsideConfig
    axes = ("lr_scale",)


def test_outside_package_registers_through_entry_points(monkeypatch):
    monkeypatch.setattr(method_module, "_registry", dict(method_module._registry))
    monkeypatch.setattr(method_module, "_loaded", False)
    ep = EntryPoint("outside_method", f"{__name__}:OutsideMethod", method_module.ENTRY_POINT_GROUP)
    monkeypatch.setattr(method_module, "entry_points", lambda group: [ep] if group == method_module.ENTRY_POINT_GROUP else [])
    assert "outside_method" in method_names()
    assert get_method("outside_method") is OutsideMethod
    assert validate_method_config("outside_method", {"lr_scale": 2}).lr_scale == 2.0


def test_entry_point_with_mismatched_name_fails(monkeypatch):
    monkeypatch.setattr(method_module, "_registry", dict(method_module._registry))
    monkeypatch.setattr(method_module, "_loaded", False)
    ep = EntryPoint("other_name", f"{__name__}:OutsideMethod", method_module.ENTRY_POINT_GROUP)
    monkeypatch.setattr(method_module, "entry_points", lambda group: [ep])
    with pytest.raises(ConfigError, match="entry point 'other_name'.*'outside_method'"):
        method_names()


def test_registering_a_second_class_under_a_taken_name_fails():
    class Impostor(OutsideMethod):
        name = "sol_rl"
    with pytest.raises(ConfigError, match="registered twice"):
        method_module.register(Impostor)


# -- advantages ---------------------------------------------------------------------------------
def test_per_prompt_advantages_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
    adv = group_advantages(rewards, list("aaabbb"), global_std=False)
    std_a, std_b = math.sqrt(2 / 3), math.sqrt(2.0)
    expected = [-1 / (std_a + 1e-4), 0.0, 1 / (std_a + 1e-4), -1 / (std_b + 1e-4), -1 / (std_b + 1e-4), 2 / (std_b + 1e-4)]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_global_std_advantages_by_hand():
    rewards = torch.tensor([1.0, 2.0, 3.0, 10.0, 10.0, 13.0])
    mean_all = sum(rewards.tolist()) / 6
    std_all = math.sqrt(sum((r - mean_all) ** 2 for r in rewards.tolist()) / 6)
    adv = group_advantages(rewards, list("aaabbb"), global_std=True)
    expected = [(r - m) / (std_all + 1e-4) for r, m in zip(rewards.tolist(), [2, 2, 2, 11, 11, 11])]
    torch.testing.assert_close(adv, torch.tensor(expected))


def test_advantages_are_clipped_and_unbiased_std_is_available():
    rewards = torch.tensor([0.0] * 99 + [1.0])
    adv = group_advantages(rewards, ["p"] * 100, global_std=False)
    assert float(adv[-1]) == 5.0  # 0.99 / 0.0995 = 9.95 before clipping
    adv = group_advantages(torch.tensor([1.0, 3.0]), ["p", "p"], global_std=False, eps=1e-8, unbiased=True)
    torch.testing.assert_close(adv, torch.tensor([-1 / math.sqrt(2), 1 / math.sqrt(2)]))


def test_constant_group_has_zero_advantage():
    adv = group_advantages(torch.tensor([0.5, 0.5, 0.1, 0.9]), list("aabb"), global_std=False)
    assert adv[:2].tolist() == [0.0, 0.0]


# -- selection ----------------------------------------------------------------------------------
REWARDS = torch.tensor([0.5, 0.9, 0.1, 0.9, 0.3, 0.7])


def test_best_worst_by_hand():
    assert select_indices(REWARDS, 4, "best_worst").tolist() == [1, 3, 2, 4]
    assert select_indices(REWARDS, 3, "best_worst").tolist() == [1, 2, 4]  # floor(3/2) best, ceil(3/2) worst


def test_best_worst_with_ties_never_duplicates():
    assert sorted(select_indices(torch.zeros(4), 4, "best_worst").tolist()) == [0, 1, 2, 3]


def test_mean_deviation_by_hand():
    assert select_indices(REWARDS, 3, "mean_deviation").tolist() == [2, 1, 3]


def test_random_modes_follow_the_generator():
    def pick(mode, seed):
        return select_indices(REWARDS, 4, mode, torch.Generator().manual_seed(seed)).tolist()
    assert pick("random", 0) == pick("random", 0)
    assert len(set(pick("random", 0))) == 4
    ext = pick("extremes_random", 3)
    assert ext[:2] == [1, 2] and len(set(ext)) == 4
    assert select_indices(REWARDS, 2, "extremes_random").tolist() == [1, 2]


def test_select_per_group_uses_flat_layout():
    rewards = torch.tensor([0.1, 0.9, 0.5, 0.2, 0.8, 0.3])
    assert select_per_group(rewards, 3, 2, "best_worst") == [1, 0, 4, 3]


def test_selection_errors():
    with pytest.raises(ValueError, match="cannot select k=7 of n=6"):
        select_indices(REWARDS, 7)
    with pytest.raises(ValueError, match="unknown selection mode"):
        select_indices(REWARDS, 2, "bestworst")


# -- a method's settings: one typed path, its own rules, its names --------------------------------
SPEC_BASE = "name: t\nbase: {model: {name: tiny}, iterations: 3, eval: {every: 1, n_prompts: 2, seeds_per_prompt: 1}}\n"


@dataclasses.dataclass
class WideConfig:
    width: int = dataclasses.field(default=2, metadata={"help": "samples per prompt"})
    depth: int = dataclasses.field(default=1, metadata={"help": "steps of its own stage"})


class WideMethod(Method):
    """A method of a test alone: its own rule (depth within the run's sampling.steps) is checked at expansion,
    with no harness file edited."""

    name = "wide_method"
    display_name = "Wide (test)"
    Config = WideConfig
    axes = ("width", "depth")
    timed_phases = frozenset({"rollout", "reward", "sync"})

    @classmethod
    def validate(cls, config, run):
        if config.depth > run.sampling.steps:
            yield "method_config.depth", f"depth {config.depth} exceeds sampling.steps={run.sampling.steps}"

    @classmethod
    def trained_per_prompt(cls, config):
        return config.width


@pytest.fixture
def wide_method(monkeypatch):
    method_names()  # the built-in methods first, then the test's own into a copy of the registry
    monkeypatch.setattr(method_module, "_registry", dict(method_module._registry))
    method_module.register(WideMethod)
    return WideMethod


def _spec(tmp_path, body: str):
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC_BASE + body)
    return path


def test_a_methods_own_rule_fails_at_expansion_naming_the_key_and_line(tmp_path, wide_method):
    from solbench.spec import load_spec

    path = _spec(tmp_path, "matrix:\n  method: [wide_method]\n  depth: [50]\n")
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    message = str(info.value)
    assert "run (method=wide_method, depth=50): method_config.depth: depth 50 exceeds sampling.steps=10" in message
    line = int(message.split(":")[1])
    assert path.read_text().splitlines()[line - 1].strip().startswith("depth:"), message
    # strict: a key its Config lacks is refused, naming the method
    path = _spec(tmp_path, "methods: {wide_method: {method_config: {micro_batch_size: 3}}}\nmatrix: {method: [wide_method]}\n")
    with pytest.raises(ConfigError, match=r"unknown field\(s\) 'micro_batch_size' for method 'wide_method'"):
        load_spec(path)
    spec = load_spec(_spec(tmp_path, "matrix:\n  method: [wide_method]\n  depth: [10]\n"))
    assert spec.runs[0].config.method_config.config == WideConfig(depth=10)


def test_an_unknown_settings_key_names_the_key_the_method_and_its_line(tmp_path):
    from solbench.spec import load_spec

    path = _spec(tmp_path, "methods:\n  sol_rl:\n    method_config:\n      n: 8\n      kk: 4\nmatrix:\n  method: [sol_rl]\n")
    with pytest.raises(ConfigError) as info:
        load_spec(path)
    message = str(info.value)
    assert "method_config: unknown field(s) 'kk' (did you mean 'k'?) for method 'sol_rl'" in message, message
    line = int(message.split(":")[1])
    assert path.read_text().splitlines()[line - 1].strip().startswith("kk:"), message


def test_settings_travel_typed_from_the_spec_and_hash_as_their_mapping(tmp_path):
    import pickle

    from solbench.config import RunConfig
    from solbench.method import MethodSettings, method_settings
    from solbench.spec import load_spec

    spec = load_spec(_spec(tmp_path, "matrix: {method: [sol_rl], n: [8], k: [4]}\n"))
    cfg = spec.runs[0].config
    settings = cfg.method_config
    assert isinstance(settings, MethodSettings) and type(settings.config).__name__ == "SolRLConfig"
    assert (settings.config.n, settings["k"]) == (8, 4)
    assert method_settings("sol_rl", settings) is settings  # no rebuild on the way to the method
    with pytest.raises(TypeError, match="fixed at expansion"):
        settings["k"] = 2
    stored = RunConfig.from_dict(cfg.to_dict())  # spec.json's mapping: the same run
    assert type(cfg.to_dict()["method_config"]) is dict and stored.run_id == cfg.run_id
    assert method_settings("sol_rl", stored.method_config).config == settings.config
    assert pickle.loads(pickle.dumps(settings)).config == settings.config


def test_display_name_and_phases_are_the_methods_and_recorded_with_the_run(wide_method):
    import json

    from solbench.train.facts import run_facts

    assert get_method("sol_rl").shown_name() == "Sol-RL"
    assert get_method("sol_rl").rollout_phases() == {"explore", "select", "regenerate", "reward"}
    facts = run_facts({"method": "wide_method", "model": {"name": "tiny"}, "eval": {}}, explores=False)
    assert facts["fact_method_display"] == "Wide (test)"
    assert json.loads(facts["fact_rollout_phases"]) == ["reward", "rollout"]
    assert facts["fact_method_display"] is not None and "method" not in facts["fact_notes"]


@pytest.mark.parametrize("name", BUILTIN)
def test_every_builtin_method_declares_its_display_name(name):
    from solbench.report.method_names import _ALIASES, normalise_method

    cls = get_method(name)
    assert cls.display_name, f"{name} must declare display_name"
    # the report's table (its fallback for results collected before runs recorded the name) agrees
    assert _ALIASES[normalise_method(name)] == cls.display_name


def test_run_id_rows_of_method_fields_name_a_field_with_that_default():
    """config.HASHED_ONLY_WHEN_SET's method_config rows (kept with the run-id rule: a run id is computed before
    any method loads) must each be a field of a registered method's Config whose default is that value."""
    from solbench.config import HASHED_ONLY_WHEN_SET

    defaults = {}
    for name in BUILTIN:
        for f in dataclasses.fields(get_method(name).Config):
            defaults.setdefault(f.name, set()).add(repr(get_method(name).Config().__getattribute__(f.name)))
    for (section, field_name), unset in HASHED_ONLY_WHEN_SET.items():
        if section == "method_config":
            assert defaults.get(field_name) == {repr(unset)}, (field_name, defaults.get(field_name), unset)


def test_the_report_reads_the_recorded_display_name_and_phases_else_its_table(monkeypatch):
    """The report never imports a method: it reads the names and phases the runs recorded, and its own table of
    the built-in methods for results collected before they did."""
    import json
    import types

    import pandas as pd

    import solbench.report.method_names as method_names
    import solbench.report.tables as tables
    from solbench.results.stored_facts import FACTS_SCHEMA, SCHEMA_COLUMN

    monkeypatch.setattr(method_names, "_RECORDED", {})  # the names the loaded results recorded (a module's state)
    old = pd.DataFrame({"run_id": ["a"], "method": ["sol_rl"]})  # collected before the facts
    tables._remember_display_names(old)
    assert tables.method_display("sol_rl") == "Sol-RL" and tables.method_display("wide_method") == "wide_method"
    assert tables.Tables.rollout_phases(types.SimpleNamespace(runs=old)) == tables.ROLLOUT_PHASES
    new = pd.DataFrame({"run_id": ["b"], "method": ["wide_method"], SCHEMA_COLUMN: [FACTS_SCHEMA],
                        "fact_method_display": ["Wide (test)"], "fact_rollout_phases": [json.dumps(["reward", "rollout"])]})
    tables._remember_display_names(new)
    assert tables.method_display("wide_method") == "Wide (test)"
    assert tables.Tables.rollout_phases(types.SimpleNamespace(runs=new)) == ("rollout", "reward")
