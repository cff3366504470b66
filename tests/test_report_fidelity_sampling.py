"""The standalone fidelity experiment's sampling: both precisions for every seed, paired by the report."""

import copy

import pytest
import torch

from solbench.config import ModelConfig
from solbench.engine.engine import Engine, SamplerSpec
from solbench.errors import ConfigError
from solbench.report.fidelity import group_fidelity, pair_candidates
from solbench.report.fidelity_sampling import fidelity_experiment
from solbench.engine.timing import PhaseTimer


def brightness(images, prompts):
    mean = images.mean(dim=(1, 2, 3))
    return mean, {"brightness": mean, "red": images[:, 0].mean(dim=(1, 2))}


@pytest.fixture(scope="module")
def engine():
    from solbench.models import build_adapter

    adapter = build_adapter(ModelConfig(name="tiny", path="random"))
    explore = copy.deepcopy(adapter.transformer)
    with torch.no_grad():  # a perturbed copy stands in for the quantized one
        for p in explore.parameters():
            p.add_(0.01 * torch.randn_like(p))
    return Engine(adapter, {"policy": adapter.transformer, "explore": explore}, brightness, PhaseTimer(), run_seed=5)


def test_fidelity_experiment_scores_every_seed_at_both_precisions(engine):
    prompts = [{"id": "a", "text": "two red circles"}, {"id": "b", "text": "one blue square"}]
    df = fidelity_experiment(engine, prompts, 3, explore_sampler=SamplerSpec("euler", 2),
                             full_sampler=SamplerSpec("euler", 3), batch_seeds=2)
    assert len(df) == 2 * 3 * 2 * 3  # prompts x seeds x precisions x (total + 2 parts)
    assert set(df.reward_name) == {"total", "brightness", "red"}
    full = df[(df.precision == "full") & (df.reward_name == "brightness")].set_index(["prompt_id", "cand_idx"])
    explore = df[(df.precision == "explore") & (df.reward_name == "brightness")].set_index(["prompt_id", "cand_idx"])
    assert (full.noise_seed == explore.noise_seed.loc[full.index]).all()  # the same seeds at both precisions
    assert not torch.allclose(torch.tensor(full.reward.values), torch.tensor(explore.reward.loc[full.index].values))
    # sampling a seed again alone regenerates it exactly (the pairing the report relies on)
    again = engine.sample(["a"], ["two red circles"], [2], net="policy", sampler=SamplerSpec("euler", 3),
                          phase="regenerate", stream="fidelity")
    assert float(again.images.mean()) == pytest.approx(full.loc[("a", 2), "reward"], rel=1e-6)
    groups = group_fidelity(pair_candidates(df), (2,))
    assert len(groups) == 2 * 3 and set(groups["kind"]) == {"all seeds"}


def test_fidelity_experiment_rejects_a_single_seed(engine):
    with pytest.raises(ConfigError, match="at least 2 seeds"):
        fidelity_experiment(engine, ["x"], 1, explore_sampler=SamplerSpec("euler", 2), full_sampler=SamplerSpec("euler", 2))
