"""One kernel path's side of tests/test_kernel_paths.py, run in a subprocess whose environment caps the CPU
kernels (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA are read once, at import):

    python tests/_kernel_path_check.py MUTATION

On 1 thread (what every rank and every run computes on: numerics.threads), the tiny engine's stochastic
rollout of 5 candidates (tests/_dist_worker.py) computed whole, as one process does, and as the two shards
of 2 ranks (3 + 2 candidates: the noise is a function of the candidate, not of its batch). MUTATION:
``none``; ``no_padding`` (the engine's batch and linear-row padding off: solbench.models.batch_invariance);
``wrong_shard`` (rank 1 computes candidates shifted by one, as an off-by-one shard would). Prints one JSON
object: the capability torch runs at, what tests/_cpu.py's probe says of this path, and per tensor whether
the shards give the whole batch's bits and their largest difference relative to the float32 bound.
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _dist_worker  # noqa: E402
from _cpu import ATOL, RTOL, gemm_rows_invariant  # noqa: E402

from solbench.engine.engine import Engine  # noqa: E402
from solbench.engine.timing import PhaseTimer  # noqa: E402


def shard_rollout(engine, rows, shift=0):
    spec = _dist_worker.SamplerSpec("flowgrpo_sde", 3, noise_level=0.7)
    ids = [_dist_worker.PROMPT_IDS[i] for i in rows]
    texts = [_dist_worker.PROMPTS[i] for i in rows]
    cands = [_dist_worker.CANDIDATES[i] + shift for i in rows]
    out = engine.sample(ids, texts, cands, sampler=spec, phase="rollout", stream="train/1", keep_trajectory=True)
    engine.score(out)
    return out


def main(mutation: str) -> None:
    torch.set_num_threads(1)
    adapter, rewards = _dist_worker.build()
    padding = {} if mutation != "no_padding" else {"batch_multiple": 1, "pad_rows": False}
    engine = Engine(adapter, {"policy": adapter.transformer}, rewards, PhaseTimer(), run_seed=3, **padding)
    whole = _dist_worker.rollout(engine)
    first = shard_rollout(engine, [0, 1, 2])
    second = shard_rollout(engine, [3, 4], shift=1 if mutation == "wrong_shard" else 0)
    report = {"capability": torch.backends.cpu.get_cpu_capability(), "probe_invariant": gemm_rows_invariant(),
              "tensors": {}}
    for name, get in (("x0", lambda o: o.x0), ("trajectory", lambda o: o.trajectory.xs),
                      ("log_probs", lambda o: o.trajectory.log_probs), ("rewards", lambda o: o.rewards)):
        expected, got = get(whole), torch.cat([get(first), get(second)])
        excess = ((got - expected).abs() / (ATOL + RTOL * expected.abs())).max().item()
        report["tensors"][name] = {"identical": bool(torch.equal(got, expected)), "bound_ratio": excess}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
