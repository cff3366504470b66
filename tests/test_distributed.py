"""Several ranks within one run (solbench.engine.distributed), on CPU with the gloo backend.

- The engine shards a rollout over 2 ranks and gathers latents, trajectories and rewards: each rank
  ends with exactly what one process computes for the whole batch, holding only its own images.
- Gradients are summed over ranks.
- End to end: `torchrun --nproc-per-node 2 -m solbench run SPEC` with world_size 2 gives the same
  candidates (seeds, rewards, selections), metrics and weights as one process with the same global
  batch (and grad_accum x 2), for Sol-RL (explore/select/regenerate) and FlowGRPO (trajectories and
  log-probs), with several optimizer steps per iteration.
- A run asking for more ranks than were started says how to start them.

Every rank and the one process compute on 1 thread (numerics.threads), whatever else runs on the machine.
"The same" is bit for bit where this CPU's float32 GEMM is row-invariant at the padded row counts (Intel
MKL's AVX-512 kernels, on Intel Xeons and an AMD EPYC Zen 4) and up to float32 rounding elsewhere (MKL's
AVX2 kernels); tests/_cpu.py measures which, tests/test_kernel_paths.py checks that verdict under each
kernel cap, and the session's last line counts the comparisons in each mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _cpu import assert_same_numbers, one_thread
from solbench.engine.distributed import DistContext, init_distributed
from solbench.errors import ConfigError

TESTS = Path(__file__).parent


def torchrun(args: list[str], cwd: Path, timeout: int = 240) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize("n", [0, 1, 2, 5, 8, 11])
@pytest.mark.parametrize("world", [1, 2, 3, 8])
def test_shards_are_contiguous_balanced_and_cover_every_row(n, world):
    shards = [DistContext(rank=r, world_size=world).shard(n) for r in range(world)]
    assert [i for s in shards for i in range(s.start, s.stop)] == list(range(n))
    sizes = [s.stop - s.start for s in shards]
    assert max(sizes) - min(sizes) <= 1


def test_engine_shards_rollouts_and_gathers_latents_trajectories_and_rewards(tmp_path):
    sys.path.insert(0, str(TESTS))
    try:
        import _dist_worker
    finally:
        sys.path.remove(str(TESTS))
    torchrun([str(TESTS / "_dist_worker.py"), str(tmp_path)], cwd=tmp_path)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]

    from solbench.engine.engine import Engine
    from solbench.engine.timing import PhaseTimer

    adapter, rewards = _dist_worker.build()
    with one_thread():  # as the ranks compute (1 thread each)
        single = _dist_worker.rollout(Engine(adapter, {"policy": adapter.transformer}, rewards, PhaseTimer(),
                                             run_seed=3))
    assert ranks[0]["image_rows"] == [0, 1, 2] and ranks[1]["image_rows"] == [3, 4]  # 5 samples: 3 + 2
    for got in ranks:  # every rank holds the whole batch: what one process computes (bit for bit
        # where this CPU's GEMM is row-invariant, else up to float32 rounding: tests/_cpu.py)
        assert_same_numbers(got["x0"], single.x0, "x0")
        assert_same_numbers(got["xs"], single.trajectory.xs, "trajectory")
        assert_same_numbers(got["log_probs"], single.trajectory.log_probs, "log-probs")
        assert_same_numbers(got["rewards"], single.rewards, "rewards")
        assert set(got["parts"]) == {"colorfulness", "jpeg_compressibility"}
        for name, value in got["parts"].items():
            assert_same_numbers(value, single.reward_parts[name], f"reward part {name}")
        for grad in got["grads"]:  # rank 0 contributes 1, rank 1 contributes 2 to every gradient entry
            assert torch.equal(grad, torch.full_like(grad, 3.0))


SPEC = """
name: dist
launch: local
base:
  model: {name: tiny}
  rewards: {shapes_geneval: 1.0}
  train_prompts: shapes/train
  prompts_per_iter: 2
  iterations: 2
  checkpoint_every: 1
  world_size: WORLD
  finetune: {lora_rank: 4, lora_alpha: 8, grad_accum: ACCUM}
  sampling: {steps: 3, eval_steps: 2}
  eval: {every: 2, prompts: shapes/eval, n_prompts: 3, seeds_per_prompt: 1, rewards: [shapes_geneval], grid_prompts: 2}
  # weight-only NVFP4: with W4A4 the activations' per-tensor global scale depends on which samples
  # share a GEMM, so FP4 explore rewards depend on the sharding (as on GPUs, per-GPU batches)
  quant: {recipe: nvfp4_w4a16}
matrix:
  method: [sol_rl, flow_grpo]
  n: [4]
  k: [2]
  explore_steps: [2]
  group_size: [3]
# one sample per micro-batch: several optimizer steps per iteration, so the accumulation over ranks
# is exercised (2 ranks x grad_accum 1 == 1 process x grad_accum 2)
methods:
  sol_rl: {method_config: {micro_batch_size: 1}}
  flow_grpo: {method_config: {micro_batch_size: 1}}
"""


def read_results(root: Path) -> dict[str, dict]:
    runs = {}
    for run_dir in sorted((root / "dist").iterdir()):
        if not (run_dir / "spec.json").exists():
            continue
        method = json.loads((run_dir / "spec.json").read_text())["method"]
        tables = {t: [json.loads(line) for line in (run_dir / f"{t}.jsonl").read_text().splitlines()]
                  for t in ("metrics", "candidates", "timings")}
        checkpoint = torch.load(sorted((run_dir / "checkpoints").glob("*.pt"))[-1], weights_only=True)
        runs[method] = {"tables": tables, "status": json.loads((run_dir / "status.json").read_text()),
                        "checkpoint": checkpoint, "grids": sorted(p.name for p in (run_dir / "samples").glob("*.png"))}
    return runs


def flat_tensors(obj, prefix=""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from flat_tensors(value, f"{prefix}/{key}")
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from flat_tensors(value, f"{prefix}/{i}")


def test_two_ranks_train_exactly_like_one_process_with_the_same_global_batch(tmp_path):
    from solbench.cli import main as solbench_main

    (tmp_path / "two.yaml").write_text(SPEC.replace("WORLD", "2").replace("ACCUM", "1"))
    (tmp_path / "one.yaml").write_text(SPEC.replace("WORLD", "1").replace("ACCUM", "2"))
    torchrun(["-m", "solbench", "run", "two.yaml", "--results", "two", "--no-report", "--quiet"], cwd=tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert solbench_main(["run", "one.yaml", "--results", "one", "--no-report", "--quiet"]) == 0
    finally:
        os.chdir(cwd)
    two, one = read_results(tmp_path / "two"), read_results(tmp_path / "one")
    assert set(two) == set(one) == {"sol_rl", "flow_grpo"}
    for method in one:
        a, b = one[method], two[method]
        assert b["status"]["state"] == "done" and b["status"]["result"]["step"] == 2
        key = ("step", "prompt_id", "cand_idx", "noise_seed", "precision", "selected")
        # the same seeds explored, scored, selected and regenerated, with the same rewards
        cands_a = [tuple(r[k] for k in key) + (r["reward"],) for r in a["tables"]["candidates"]]
        cands_b = [tuple(r[k] for k in key) + (r["reward"],) for r in b["tables"]["candidates"]]
        step1_a, step1_b = [c for c in cands_a if c[0] == 1], [c for c in cands_b if c[0] == 1]
        assert step1_a and [c[:-1] for c in step1_a] == [c[:-1] for c in step1_b]
        # from the same weights: bit for bit where this CPU's GEMM is row-invariant (tests/_cpu.py)
        assert_same_numbers(torch.tensor([c[-1] for c in step1_b], dtype=torch.float64),
                            torch.tensor([c[-1] for c in step1_a], dtype=torch.float64), f"{method} step-1 rewards")
        assert len(cands_a) == len(cands_b)
        for ca, cb in zip(cands_a, cands_b):  # step 2 follows weights equal up to summation order
            assert ca[:-1] == cb[:-1] and ca[-1] == pytest.approx(cb[-1], abs=1e-5)
        metrics_a = {(r["step"], r["split"], r["metric"]): r["value"] for r in a["tables"]["metrics"]}
        metrics_b = {(r["step"], r["split"], r["metric"]): r["value"] for r in b["tables"]["metrics"]}
        assert set(metrics_a) == set(metrics_b)
        for k, value in metrics_a.items():
            assert metrics_b[k] == pytest.approx(value, rel=1e-4, abs=1e-6), (method, k)
        # rank 0 alone wrote the rows: one set of timing rows per phase occurrence, as in one process
        phases = lambda rows: [(r["step"], r["phase"], r["n_images"]) for r in rows]  # noqa: E731
        assert phases(a["tables"]["timings"]) == phases(b["tables"]["timings"])
        assert a["grids"] == b["grids"]
        weights_a = dict(flat_tensors(a["checkpoint"]["state"]["nets"]))
        weights_b = dict(flat_tensors(b["checkpoint"]["state"]["nets"]))
        assert weights_a.keys() == weights_b.keys()
        assert any("policy" in name for name in weights_a)
        for name, value in weights_a.items():
            torch.testing.assert_close(weights_b[name], value, rtol=1e-5, atol=1e-6, msg=f"{method} {name}")


def test_a_run_for_more_ranks_than_started_says_how_to_start_them(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match=r"world_size=8.*torchrun --nproc-per-node 8 -m solbench run"):
        init_distributed(8)


def test_a_single_rank_run_inside_a_multi_process_launch_is_refused(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="world_size=1"):
        init_distributed(1)
