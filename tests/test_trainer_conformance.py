"""Conformance of every registered method with the harness, on the embedded tiny model.

For each method (small settings so that a run takes seconds, untrained weights, a continuous reward
so that advantages are never all zero):
- one iteration changes the trained parameters and emits the required rows (metrics, timings,
  candidates, eval rows at step 0 and at the end, TensorBoard events, a sample grid);
- a second run with the same seed gives identical rows;
- that second run is interrupted during iteration 3 and resumed from the checkpoint of iteration 2:
  iterations 3-4 reproduce the first run exactly and no row is lost or duplicated.
"""

from __future__ import annotations

import copy

import pytest
import torch

from solbench.config import FinetuneConfig, RunConfig
from solbench.errors import NonFiniteLossError
from solbench.method import get_method, method_names, validate_method_config
from solbench.results import RunStore
from solbench.train.trainer import Trainer, train_run

import _tiny_config as tiny_config

ITERATIONS = 4


def small_config(method: str, **overrides) -> RunConfig:
    return tiny_config.small_config(method, experiment="conformance", planned_iterations=ITERATIONS, seed=7, **overrides)


def comparable(store: RunStore) -> dict[str, list[dict]]:
    """Every row minus the wall-clock fields and the machine's load, which legitimately differ between runs."""
    tables = {}
    for table in ("metrics", "timings", "candidates"):
        rows = []
        for row in store.read(table):
            row = {k: v for k, v in row.items() if k not in ("wall_s", "seconds", "load", "run_id")}
            rows.append(row)
        tables[table] = rows
    return tables


class Interrupt(Exception):
    pass


BUILTIN = sorted(set(method_names()) - {"outside_method"})


@pytest.mark.parametrize("method", BUILTIN)
def test_every_method_declares_valid_tiny_settings_and_its_phases(method):
    """Each method declares its own tiny settings (Method.tiny_config); they must be valid Config
    overrides, and it must declare the phases it times (Method.timed_phases), which the conformance
    run below checks."""
    cls = get_method(method)
    validate_method_config(method, cls.tiny_config, where=f"{method}.tiny_config")
    assert cls.timed_phases and all(isinstance(p, str) and p for p in cls.timed_phases), (
        f"{method} must declare timed_phases, the phases one iteration times besides 'train'")
    assert isinstance(cls.display_name, str) and cls.display_name, (
        f"{method} must declare display_name, the name reports give it (recorded with each run's results)")


@pytest.mark.parametrize("method", BUILTIN)
def test_method_conformance(method, tmp_path):
    cfg = small_config(method)
    store_a = RunStore(tmp_path / "a", cfg.run_id)
    trainer = Trainer(cfg, store_a)
    before = [t.detach().clone() for t in trainer.nets.trainable("policy")]
    changed_after_first = {}

    def watch(run_id, step, phase, info):
        if step == 1 and phase == "train":
            after = trainer.nets.trainable("policy")
            changed_after_first["delta"] = max(float((a.detach() - b).abs().max()) for a, b in zip(after, before))

    trainer.progress = watch
    summary = trainer.run()
    assert summary["step"] == ITERATIONS
    assert changed_after_first["delta"] > 0, "one iteration left the trained parameters unchanged"

    rows = comparable(store_a)
    train = {(r["step"], r["metric"]) for r in rows["metrics"] if r["split"] == "train"}
    for step in range(1, ITERATIONS + 1):
        for metric in ("reward", "reward_all", "loss", "grad_norm", "lr"):
            assert (step, metric) in train, f"missing train metric {metric} at step {step}"
    eval_steps = sorted({r["step"] for r in rows["metrics"] if r["split"] == "eval"})
    assert eval_steps == [0, 4]
    assert any(r["metric"].startswith("colorfulness/") for r in rows["metrics"] if r["split"] == "eval")
    phases = {r["phase"] for r in rows["timings"] if r["step"] == 1}
    assert phases == get_method(method).timed_phases | {"train"}, (
        f"{method}'s iteration timed {sorted(phases)}; it declares timed_phases {sorted(get_method(method).timed_phases)}")
    step1 = [r for r in rows["candidates"] if r["step"] == 1]
    assert step1 and all(r["prompt_id"].startswith("train-") for r in step1)
    assert any(r["selected"] for r in step1)
    assert list((tmp_path / "a" / "tb").iterdir()), "no TensorBoard events"
    assert len(list((tmp_path / "a" / "samples").glob("*.png"))) == 2

    # A second run with the same seed, interrupted during iteration 3, then resumed.
    store_b = RunStore(tmp_path / "b", cfg.run_id)

    def interrupt(run_id, step, phase, info):
        if step == 3 and phase == "train":
            raise Interrupt

    with pytest.raises(Interrupt):
        train_run(cfg, store_b, progress=interrupt)
    assert store_b.latest_checkpoint()[0] == 2
    train_run(cfg, store_b)
    assert comparable(store_b) == rows


def test_nan_loss_stops_the_run_with_a_clear_error(tmp_path):
    cfg = small_config("diffusion_nft", iterations=1)
    trainer = Trainer(cfg, RunStore(tmp_path, cfg.run_id))
    original = trainer.method.loss

    def poisoned(engine, chunk):
        loss, logs = original(engine, chunk)
        return loss * float("nan"), logs

    trainer.method.loss = poisoned
    with pytest.raises(NonFiniteLossError, match="loss is nan at step 1, micro-batch 0"):
        trainer.run()


def test_full_finetuning_and_gradient_accumulation(tmp_path):
    """Full fine-tuning trains every transformer weight; grad_accum=2 over micro-batches of 3 samples
    makes one optimizer step per two micro-batches."""
    cfg = small_config("diffusion_nft", iterations=1, prompts_per_iter=2,
                       method_config={"group_size": 3, "micro_batch_size": 3},
                       finetune=FinetuneConfig(mode="full", lr=1e-4, grad_accum=2))
    trainer = Trainer(cfg, RunStore(tmp_path, cfg.run_id))
    before = copy.deepcopy(trainer.adapter.transformer.state_dict())
    trainer.run()
    after = trainer.adapter.transformer.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert len(changed) > len(before) // 2
    steps = [r for r in trainer.store.read("metrics") if r["metric"] == "optimizer_steps"]
    assert [r["value"] for r in steps] == [1.0]  # 6 samples -> 2 micro-batches -> 1 step
    assert get_method("diffusion_nft").nets <= set(trainer.nets)


def test_eval_metrics_per_skill_ignore_prompts_without_a_skill(tmp_path):
    """A prompt file where some records name a skill and others do not (a .txt names none):
    per-skill rows for the named skills only, every prompt in the overall metric."""
    import json

    prompts = tmp_path / "eval.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in (
        {"id": "e1", "text": "two red circles", "skill": "counting"},
        {"id": "e2", "text": "a blue square"},
        {"id": "e3", "text": "a green triangle", "skill": "single_object"})))
    cfg = small_config("diffusion_nft", iterations=1)
    cfg.eval.prompts, cfg.eval.n_prompts = str(prompts), None
    store = RunStore(tmp_path / "run", cfg.run_id)
    train_run(cfg, store)
    names = {r["metric"] for r in store.read("metrics") if r["split"] == "eval" and r["step"] == 0}
    assert names == {"colorfulness", "colorfulness/counting", "colorfulness/single_object"}
    values = {r["metric"]: r["value"] for r in store.read("metrics") if r["split"] == "eval" and r["step"] == 0}
    # the overall mean covers all three prompts: it is not the mean of the two per-skill values
    assert values["colorfulness"] != pytest.approx((values["colorfulness/counting"]
                                                    + values["colorfulness/single_object"]) / 2, abs=1e-9)
