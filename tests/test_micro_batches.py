"""Rollout, reward and training micro-batches: spec settings that bound memory and leave results alone.

- On CPU a run gives the same candidates, rewards and eval scores bit for bit, and the same trained
  weights up to float summation order, whatever micro-batches it uses (and they are really used).
- Spec expansion fills unset micro-batches with the model's defaults, writes ``train`` into the
  method's micro_batch_size (one setting), and rejects bad values and conflicts.
- The real specs set them.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from solbench.config import EvalConfig, FinetuneConfig, MicroBatchConfig, ModelConfig, RunConfig, SamplingConfig
from solbench.errors import ConfigError
from solbench.method import get_method
from solbench.models import MICRO_BATCH_DEFAULTS
from solbench.results import RunStore
from solbench.spec import load_spec
from solbench.train.trainer import Trainer


def _cfg(micro: MicroBatchConfig, grad_accum: int, method: str = "diffusion_nft") -> RunConfig:
    return RunConfig(
        experiment="micro", method=method, method_config=dict(get_method(method).tiny_config),
        model=ModelConfig(name="tiny", path="random"), rewards={"colorfulness": 1.0, "shapes_clip": 0.5},
        prompts_per_iter=2, iterations=2, seed=3,
        finetune=FinetuneConfig(lora_rank=4, lora_alpha=8, lr=1e-3, grad_accum=grad_accum),
        sampling=SamplingConfig(steps=2, eval_steps=1),
        eval=EvalConfig(every=2, n_prompts=2, seeds_per_prompt=2, rewards=["colorfulness", "shapes_clip"], grid_prompts=1),
        micro_batch=micro, checkpoint_every=2, device="cpu")


def _run(tmp_path, micro: MicroBatchConfig, grad_accum: int):
    cfg = _cfg(micro, grad_accum)
    trainer = Trainer(cfg, RunStore(tmp_path / cfg.run_id, cfg.run_id))
    seen = {"reward": [], "train": []}
    engine_rewards = trainer.engine.rewards.rewards
    for name in engine_rewards:
        engine_rewards[name] = _Wrapped(engine_rewards[name], seen)
    trainer.eval_rewards = {name: engine_rewards[name] for name in trainer.eval_rewards}
    loss = trainer.method.loss

    def loss_spy(engine, chunk):
        seen["train"].append(len(chunk.data["prompts"]))
        return loss(engine, chunk)
    trainer.method.loss = loss_spy
    trainer.run()
    store = trainer.store
    weights = [t.detach().clone() for t in trainer.nets.trainable("policy")]
    return store, weights, seen, trainer


class _Wrapped:
    """A reward that records its call sizes; shared between the training sum and evaluation."""

    def __init__(self, reward, seen):
        self.reward, self.seen = reward, seen
        self.name, self.range, self.higher_is_better = reward.name, reward.range, reward.higher_is_better

    def __call__(self, images, prompts):
        self.seen["reward"].append(len(prompts))
        return self.reward(images, prompts)


def _rows(store, table):
    return [{k: v for k, v in r.items() if k not in ("wall_s", "seconds", "run_id")} for r in store.read(table)]


def test_results_do_not_depend_on_the_micro_batches(tmp_path):
    """DiffusionNFT (group 3): 2 prompts x 3 = 6 samples per iteration, sampled 4 + 2, scored 4 + 2,
    trained as 3 micro-batches of 2 accumulated into the same single optimizer step."""
    whole_store, whole_w, whole_seen, whole = _run(tmp_path / "a", MicroBatchConfig(), grad_accum=1)
    small_store, small_w, small_seen, small = _run(tmp_path / "b", MicroBatchConfig(rollout=4, reward=4, train=2),
                                                   grad_accum=3)
    assert small.engine.micro_batch == 4 and small.engine.reward_micro_batch == 4
    assert max(small_seen["reward"]) <= 4 < max(whole_seen["reward"])
    assert set(small_seen["train"]) == {2} and set(whole_seen["train"]) == {6}
    # rollouts and rewards of the first iteration are bit-identical (same weights, same numbers)
    first = lambda rows: [r for r in rows if r.get("step") == 1]  # noqa: E731
    assert first(_rows(small_store, "candidates")) == first(_rows(whole_store, "candidates"))
    for a, b in zip(small_w, whole_w, strict=True):  # training: the same gradient, summed in another order
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)  # Adam steps are ~lr = 1e-3
    assert not torch.equal(small_w[0], _run_initial(tmp_path))  # and it did train
    evals = lambda rows: {(r["step"], r["metric"]): r["value"] for r in rows if r["split"] == "eval"}  # noqa: E731
    a, b = evals(_rows(small_store, "metrics")), evals(_rows(whole_store, "metrics"))
    assert a.keys() == b.keys()
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
    assert a[(0, "colorfulness")] == b[(0, "colorfulness")]  # step 0: the base model, bit-identical


def _run_initial(tmp_path):
    cfg = _cfg(MicroBatchConfig(), grad_accum=1)
    return Trainer(cfg, RunStore(tmp_path / "c" / cfg.run_id, cfg.run_id)).nets.trainable("policy")[0].detach().clone()


def test_one_reward_instance_serves_training_and_evaluation(tmp_path):
    cfg = _cfg(MicroBatchConfig(), grad_accum=1)
    trainer = Trainer(cfg, RunStore(tmp_path / cfg.run_id, cfg.run_id))
    for name in cfg.eval.rewards:
        assert trainer.eval_rewards[name] is trainer.engine.rewards.rewards[name]


def _spec(tmp_path, body: str):
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(body))
    return path


BASE = """\
name: mb
base:
  model: {name: tiny, path: random}
  rewards: {colorfulness: 1.0}
  prompts_per_iter: 2
  eval: {rewards: [colorfulness]}
%s
matrix:
  method: [diffusion_nft, sol_rl]
"""


def test_spec_expansion_fills_model_defaults_and_writes_train_into_the_method(tmp_path):
    spec = load_spec(_spec(tmp_path, BASE % "  micro_batch: {train: 2}"))
    for run in spec.runs:
        mb = run.config.micro_batch
        assert (mb.rollout, mb.reward, mb.train) == (MICRO_BATCH_DEFAULTS["tiny"]["rollout"],
                                                     MICRO_BATCH_DEFAULTS["tiny"]["reward"], 2)
        assert run.config.method_config["micro_batch_size"] == 2
    # the method's own key is the same setting: it fills micro_batch.train
    spec = load_spec(_spec(tmp_path, BASE % "  method_config: {micro_batch_size: 2}"))
    assert {r.config.micro_batch.train for r in spec.runs} == {2}


@pytest.mark.parametrize("setting, message", [
    ("  micro_batch: {rollout: 0}", "micro_batch.rollout must be an integer >= 1"),
    ("  micro_batch: {train: 4}\n  method_config: {micro_batch_size: 2}", "disagree"),
])
def test_spec_expansion_rejects_bad_micro_batches(tmp_path, setting, message):
    with pytest.raises(ConfigError, match=message):
        load_spec(_spec(tmp_path, BASE % setting))


@pytest.mark.parametrize("name", ["flux_main", "sd35_main", "sana_main"])
def test_real_specs_set_micro_batches(name):
    spec = load_spec(f"experiments/{name}.yaml")
    for run in spec.runs:
        mb = run.config.micro_batch
        assert mb.rollout and mb.reward and mb.train, run.config.method
        assert run.config.method_config["micro_batch_size"] == mb.train
        if run.config.method in ("diffusion_nft", "sol_rl"):
            assert mb.train == 16  # the DiffusionNFT / Sol-RL reference


def test_missing_reward_weights_stop_the_run_at_launch(tmp_path):
    """Bug: reward models loaded lazily, so absent weights surfaced at the step-0 evaluation (after the
    model and the explore copy were built), not when the run started."""
    from solbench import rewards
    from solbench.errors import MissingWeightsError
    from solbench.rewards.real import PickScoreReward

    name = "absent_pickscore_for_tests"
    if name not in rewards.names():
        rewards.register(name, lambda device=None, **kw: PickScoreReward(model_id="solbench-test/absent-pickscore",
                                                                         device=device, **kw))
    cfg = _cfg(MicroBatchConfig(), grad_accum=1)
    cfg.eval.rewards = ["colorfulness", name]
    with pytest.raises(MissingWeightsError, match="solbench-test/absent-pickscore"):
        Trainer(cfg, RunStore(tmp_path / cfg.run_id, cfg.run_id))
