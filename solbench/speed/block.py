"""Running a spec's ``speed:`` block: rounds of interleaved arms, alone on the machine, resumable.

Layout: ``results/<spec>/speed/<block id>/`` holds ``block.json`` (what is timed: the arms' configs and run ids,
M, the warm-up, the checkpoint, the device), ``status.json``, ``rounds.jsonl`` (one line per finished round
attempt: its order, its load, accepted or not) and ``<arm>/speed.jsonl`` per arm (one row per round attempt,
iteration and phase: seconds, precision, load, the CPU or GPU, the backend, threads). The block id hashes what
changes the numbers (not R, the bound or the repeats), so raising ``rounds`` continues the same block.

A round: the arms in the block's order rotated by the round's index (solbench.spec.speed_arms.round_order), each
running M iterations back to back, each iteration's load (other programs' busy cores over every core the block
holds, ``LoadMeter``) recorded. The round's load is its busiest iteration's; above ``load_bound`` the round is
written as rejected and run again, at most ``repeats`` more times, after which the block stops with
QuietMachineError (what it measured so far is kept). Rows are appended and fsynced arm by arm, and a round counts
only once its line in rounds.jsonl is written (accepted), so a block killed between (or within) rounds resumes
at the first round without an accepted line: no round is lost or counted twice.

Exclusive: the block holds its folder's lock (one block at a time) and, on CPU, the lock of every core this
process may use (solbench.machine.threads.claim_cores, the locks training runs claim their cores with), waiting up to
``wait_s`` for other solbench work to free them; each arm then runs at its own ``numerics.threads``, pinned to
that many of the held cores.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable

from solbench.errors import SolbenchError
from solbench.results.speed_rows import ROUNDS, ROWS, SPEED_DIR, read_rounds  # noqa: F401  (the files' names)
from solbench.spec.speed_arms import Arm, block_arms, round_order


class QuietMachineError(SolbenchError):
    """The block could not get a round below its load bound within its repeats."""


class LoadMeter:
    """Other programs' busy cores on ``cores`` since ``start()``: their busy time from /proc/stat minus this
    process's CPU time, over the wall time (None where /proc/stat is unreadable), as solbench.engine.timing's load."""

    def __init__(self, cores: list[int], clock: Callable[[], float] = time.perf_counter) -> None:
        self.cores, self.clock = list(cores), clock

    def _busy(self) -> float | None:
        from solbench.engine.timing import _busy_seconds

        return _busy_seconds(self.cores)

    def start(self):
        return self._busy(), time.process_time(), self.clock()

    def stop(self, mark) -> float | None:
        busy, own, start = mark
        end, seconds = self._busy(), self.clock() - start
        if busy is None or end is None or seconds <= 0:
            return None
        return max(0.0, ((end - busy) - (time.process_time() - own)) / seconds)


def block_id(arms: list[Arm], block, device: str) -> str:
    what = {"arms": [[a.key, a.config.run_id] for a in arms], "iterations": block.iterations,
            "warmup": block.warmup, "checkpoint": block.checkpoint, "device": device}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]


def _append(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def _write_json(path: Path, data: dict) -> None:
    from solbench.results.storage import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(data, indent=1, sort_keys=True, default=str) + "\n").encode())


@contextlib.contextmanager
def exclusive_cores(device: str, wait_s: float, echo=print):
    """Every core this process may use, locked against other solbench runs (waiting up to ``wait_s``); [] on CUDA."""
    from solbench.machine.threads import available_cores, claim_cores

    if device != "cpu":
        yield []
        return
    cores = available_cores()
    deadline, said = time.monotonic() + wait_s, False
    while True:
        with claim_cores(cores) as held:
            if len(held) == len(cores):
                yield cores
                return
        if time.monotonic() >= deadline:
            raise QuietMachineError(f"speed block: other solbench work held {len(cores) - len(held)} of the "
                                    f"{len(cores)} cores for {wait_s:.0f} s; run it when that work is done")
        if not said:
            echo(f"speed block: waiting for other solbench work to free {len(cores) - len(held)} core(s)")
            said = True
        time.sleep(2.0)


@contextlib.contextmanager
def _pinned(cores: list[int], threads: int):
    """torch at ``threads`` threads on the first ``threads`` of ``cores`` (all of them where fewer), restored after."""
    import torch

    from solbench.machine.threads import _set_affinity, available_cores

    before, before_threads = available_cores(), torch.get_num_threads()
    try:
        if cores:
            _set_affinity(cores[:threads] if len(cores) >= threads else cores)
        torch.set_num_threads(min(threads, len(cores)) if cores else threads)
        yield
    finally:
        torch.set_num_threads(before_threads)
        if cores:
            _set_affinity(before)


def run_rounds(folder: Path, arms: list[Arm], block, make_runner: Callable[[Arm], Callable], *,
               cores: list[int] | None = None, load_meter=None, echo=print, resident: bool = True) -> dict:
    """The block's rounds not yet accepted in ``folder`` (module docstring); returns a summary dict.

    ``make_runner(arm)`` gives a callable ``runner(step) -> [phase rows]`` (solbench.speed.iteration.ArmRunner;
    tests pass fakes) with optional ``backend`` and ``device_name`` attributes; ``load_meter`` (default a
    LoadMeter over ``cores``) has ``start()`` and ``stop(mark) -> load``. ``resident`` False: each arm is built and
    warmed up before its turn in every round and closed after it (arms that do not fit in memory together)."""
    folder.mkdir(parents=True, exist_ok=True)
    cores = list(cores or [])
    meter = load_meter or LoadMeter(cores)
    done = {r["round"] for r in read_rounds(folder) if r.get("accepted")}
    runners: dict[str, Callable] = {}
    ran = []
    try:
        if resident and set(range(block.rounds)) - done:  # every arm built and warmed up before the first round
            for arm in arms:
                runners[arm.key] = _warmed(arm, make_runner, block.warmup, cores, echo)
        for index in range(block.rounds):
            if index in done:
                continue
            tries = 0  # this process's tries of the round (a rerun after giving up gets 1 + repeats again)
            while True:
                attempt = f"{index}.{tries}.{os.getpid()}.{time.time_ns() % 10**9}"
                order = round_order(arms, index)
                load = 0.0
                for position, arm in enumerate(order):
                    if arm.key not in runners:
                        runners[arm.key] = _warmed(arm, make_runner, block.warmup, cores, echo)
                    rows, arm_load = _time_arm(arm, runners[arm.key], index, attempt, position, block, cores, meter)
                    if not resident:
                        _close(runners.pop(arm.key))
                    _append(folder / arm.key / ROWS, rows)
                    load = max(load, arm_load)
                accepted = load <= block.load_bound
                _append(folder / ROUNDS, [{"round": index, "attempt": attempt, "order": [a.key for a in order],
                                           "load": round(load, 4), "accepted": accepted, "load_bound": block.load_bound,
                                           "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}])
                if accepted:
                    ran.append(index)
                    break
                tries += 1
                if tries > block.repeats:
                    raise QuietMachineError(
                        f"speed block: could not get a quiet machine: round {index + 1} of {block.rounds} ran "
                        f"{tries} times with other programs keeping up to {load:.2f} of the cores busy (bound "
                        f"{block.load_bound}, speed.repeats {block.repeats}); the {len(done) + len(ran)} accepted "
                        f"round(s) are kept in {folder}: run again on a quiet machine to continue")
                echo(f"speed block: round {index + 1} repeated: load {load:.2f} above the bound {block.load_bound}")
    finally:
        for runner in runners.values():
            _close(runner)
    return {"folder": str(folder), "ran": ran, "accepted": sorted(done | set(ran))}


def _close(runner) -> None:
    close = getattr(runner, "close", None)
    if close is not None:
        close()


def _warmed(arm: Arm, make_runner, warmup: int, cores: list[int], echo):
    with _pinned(cores, arm.config.numerics.threads):
        runner = make_runner(arm)
        for step in range(1, warmup + 1):
            runner(step)
    echo(f"speed block: {arm.key} built and warmed up ({warmup} iteration(s))")
    return runner


def _time_arm(arm: Arm, runner, index: int, attempt: str, position: int, block, cores, meter) -> tuple[list, float]:
    """M iterations of one arm in one round: (its phase rows, its busiest iteration's load)."""
    import torch

    rows, worst = [], 0.0
    with _pinned(cores, arm.config.numerics.threads):
        threads = torch.get_num_threads()
        for i in range(block.iterations):
            step = block.warmup + index * block.iterations + i + 1  # the same prompts in every arm of the round
            mark = meter.start()
            phases = runner(step)
            load = meter.stop(mark)
            worst = max(worst, load or 0.0)
            for p in phases:
                rows.append({"arm": arm.name, "variant": arm.variant, "key": arm.key, "method": arm.config.method,
                             "run_id": arm.config.run_id, "round": index, "attempt": attempt, "position": position,
                             "iteration": i, "step": step, "phase": p["phase"], "precision": p.get("precision", ""),
                             "seconds": p["seconds"], "phase_load": p.get("load"), "load": load,
                             "n_images": p.get("n_images", 0), "flops": p.get("flops"),
                             "device": getattr(runner, "device_name", ""), "backend": getattr(runner, "backend", ""),
                             "recipe": arm.config.quant.recipe, "threads": threads})
    return rows, worst


def run_spec_block(spec, results_root: str | Path = "results", *, published: bool = False, echo=print) -> dict | None:
    """Time the arms of ``spec.speed`` (None when the spec has no block): the block's folder, locked, on cores of
    its own; returns run_rounds' summary. The checkpoint (``speed.checkpoint``): the base model, or the final
    policy of a method's main run (loaded into every arm), which must be done."""
    block = getattr(spec, "speed", None)
    if block is None:
        return None
    import torch

    from solbench.launch.locks import run_lock
    from solbench.speed.iteration import ArmRunner
    from solbench.train.trainer import resolve_device

    arms = block_arms(spec.runs, block)
    device = resolve_device(arms[0].config.device).type
    bid = block_id(arms, block, device)
    folder = Path(results_root) / spec.name / SPEED_DIR / bid
    state = _policy_state(spec, block, results_root)
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "block.json").exists():
        _write_json(folder / "block.json", {
            "block_id": bid, "spec": spec.name, "device": device, "torch": torch.__version__,
            "arms": [{"key": a.key, "name": a.name, "variant": a.variant, "method": a.config.method,
                      "run_id": a.config.run_id, "config": a.config.to_dict()} for a in arms],
            "block": block.model_dump(), "published": published, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S")})
    with run_lock(folder, wait_s=block.wait_s) as held:
        if not held:
            raise QuietMachineError(f"speed block: another process is running it ({folder}); wait for it")
        with exclusive_cores(device, block.wait_s, echo) as cores:
            _write_json(folder / "status.json", {"state": "running", "pid": os.getpid()})
            try:
                summary = run_rounds(folder, arms, block,
                                     lambda arm: ArmRunner(arm.config, policy_state=state, published=published),
                                     cores=cores, echo=echo,
                                     resident=block.resident if block.resident is not None else device == "cpu")
            except BaseException as err:
                gave_up = isinstance(err, QuietMachineError)
                _write_json(folder / "status.json", {"state": "gave up" if gave_up else "failed",
                                                     "error": f"{type(err).__name__}: {err}"})
                raise
            _write_json(folder / "status.json", {"state": "done", "rounds": len(summary["accepted"])})
    echo(f"speed block: {len(summary['ran'])} round(s) timed now, {len(summary['accepted'])} of {block.rounds} "
         f"accepted -> {folder}")
    return summary


def _policy_state(spec, block, results_root) -> list | None:
    """The policy tensors of ``speed.checkpoint``'s run (its final checkpoint), or None for the base model."""
    if block.checkpoint == "base":
        return None
    from solbench.fidelity.checkpoint import load_checkpoint
    from solbench.spec.fidelity_plan import arm_runs

    run = arm_runs(spec.runs, block.checkpoint)[0]
    checkpoint = load_checkpoint(spec.run_dir(results_root, run.run_id))
    return checkpoint.state["nets"]["trainable"]["policy"]
