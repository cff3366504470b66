"""Sol-RL's invariants on the embedded tiny model.

- With an identity "low-precision" copy and explore steps equal to the full budget, Sol-RL selects
  the same seeds and computes the same update as naive BF16 scaling.
- The regenerated samples are bit-identical to sampling the same seeds directly at full precision,
  the candidates table links every regenerated sample to its explored seed, and the explore copy
  is re-synced to the updated old policy after the iteration.

solbench.quant has no identity recipe, so the identity copy is a plain deep copy refreshed with
load_state_dict, handed to the trainer in place of quantized_copy/sync_weights.
"""

from __future__ import annotations

import copy

import pytest
import torch

from solbench import quant
from solbench.config import EvalConfig, FinetuneConfig, ModelConfig, RunConfig, SamplingConfig
from solbench.results import RunStore
from solbench.train.trainer import Trainer

N, K, STEPS = 4, 2, 3


def identity_explore():
    def factory(module):
        return copy.deepcopy(module).requires_grad_(False)

    def sync(explore, module):
        explore.load_state_dict(module.state_dict())

    return factory, sync


def config(method: str, **method_config) -> RunConfig:
    return RunConfig(
        experiment="invariants", method=method, method_config={"n": N, "k": K, **method_config},
        model=ModelConfig(name="tiny", path="random"), rewards={"colorfulness": 1.0},
        prompts_per_iter=2, iterations=1, seed=3,
        finetune=FinetuneConfig(lora_rank=4, lora_alpha=8, lr=1e-3),
        sampling=SamplingConfig(steps=STEPS, eval_steps=1),
        eval=EvalConfig(n_prompts=1, seeds_per_prompt=1, rewards=["colorfulness"]), device="cpu")


def selected_full(store: RunStore) -> list[tuple[str, int]]:
    return sorted((r["prompt_id"], r["cand_idx"]) for r in store.read("candidates")
                  if r["precision"] == "full" and r["selected"])


def test_identity_explore_with_full_steps_equals_naive_scaling(tmp_path):
    sol = Trainer(config("sol_rl", explore_steps=STEPS), RunStore(tmp_path / "sol", "sol"), explore=identity_explore())
    naive = Trainer(config("naive_scaling"), RunStore(tmp_path / "naive", "naive"))
    for trainer in (sol, naive):
        trainer.step = 1
        trainer.train_iteration()

    assert selected_full(sol.store) == selected_full(naive.store)
    assert len(selected_full(sol.store)) == 2 * K
    proxy = {(r["prompt_id"], r["cand_idx"]): r["reward"] for r in sol.store.read("candidates") if r["precision"] == "explore"}
    naive_rewards = {(r["prompt_id"], r["cand_idx"]): r["reward"] for r in naive.store.read("candidates")}
    assert proxy.keys() == naive_rewards.keys()
    for key in proxy:
        assert proxy[key] == pytest.approx(naive_rewards[key], abs=1e-6)
    for role in ("policy", "old", "ema"):
        for a, b in zip(sol.nets.trainable(role), naive.nets.trainable(role), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(float(p.detach().abs().max()) > 0 for p in sol.nets.trainable("policy")[1::2])  # lora_B left its zero init


def test_regenerated_samples_are_the_explored_seeds_and_the_explore_copy_is_resynced(tmp_path):
    trainer = Trainer(config("sol_rl", explore_steps=2), RunStore(tmp_path, "sol"))
    x = torch.randn(2, *trainer.adapter.latent_shape)
    t = torch.tensor([0.9, 0.4])
    cond = trainer.adapter.encode(["a red circle", "a blue square"])
    explore_before = trainer.engine.velocity("explore", x, t, cond)

    seen = {}
    collect = trainer.method.collect

    def collect_and_sample_directly(engine, prompt_ids, prompts, it):
        batch = collect(engine, prompt_ids, prompts, it)
        full = [c for c in batch.candidates if c.precision == "full"]
        text_of = dict(zip(prompt_ids, prompts))
        seen["direct"] = engine.sample([c.prompt_id for c in full], [text_of[c.prompt_id] for c in full],
                                       [c.cand_idx for c in full], net="old", sampler=trainer.method.rollout_spec(),
                                       phase="rollout", stream=it.stream)
        seen["batch"] = batch
        return batch

    trainer.method.collect = collect_and_sample_directly
    trainer.step = 1
    trainer.train_iteration()
    batch, direct = seen["batch"], seen["direct"]

    # the regenerated samples are exactly the selected seeds sampled at full precision
    assert torch.equal(direct.x0, batch.data["x0"]) and direct.precision == "full"
    explore_rows = [c for c in batch.candidates if c.precision == "explore"]
    full_rows = [c for c in batch.candidates if c.precision == "full"]
    assert len(explore_rows) == 2 * N and len(full_rows) == 2 * K
    explored = {(c.prompt_id, c.cand_idx): c for c in explore_rows}
    for row in full_rows:
        source = explored[(row.prompt_id, row.cand_idx)]
        assert source.selected and source.noise_seed == row.noise_seed
    for pid in {c.prompt_id for c in explore_rows}:  # best_worst, K = 2: each prompt's best and worst proxy
        group = [c for c in explore_rows if c.prompt_id == pid]
        rewards = torch.tensor([c.reward for c in group])
        assert {c.cand_idx for c in group if c.selected} == {group[int(rewards.argmax())].cand_idx,
                                                             group[int(rewards.argmin())].cand_idx}

    # after the update the explore copy is the quantized merge of the new old policy
    explore_after = trainer.engine.velocity("explore", x, t, cond)
    assert not torch.equal(explore_before, explore_after)
    fresh = quant.quantized_copy(trainer.nets._merged_module(), trainer.cfg.quant.recipe)
    torch.testing.assert_close(explore_after, trainer.adapter.velocity(fresh, x, t, cond), rtol=0, atol=1e-6)
    assert any(r["phase"] == "sync" for r in trainer.store.read("timings"))
