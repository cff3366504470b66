"""CPU threads that follow the allocation: a run uses the cores it was given, and no more.

torch's intra-op pool defaults to every core of the machine. That is wrong in the two places
solbench runs on CPU: a Slurm task owns only ``--cpus-per-task`` cores (more threads than cores
make every OpenMP region wait out a scheduler time slice, issue 17 measured 30-75x slowdowns of
the emulated quantizer), and two local `solbench run` started side by side would each take all
cores. So each run decides its thread count once, before it starts:

1. an explicit setting (``SOLBENCH_THREADS``, or ``threads=`` from the caller) wins;
2. else, for a run resumed from a checkpoint, the count its first attempt recorded (``recorded=``,
   solbench.numerics: the thread count changes a run's numbers), capped at the cores it may run on;
3. else Slurm's ``SLURM_CPUS_PER_TASK``;
4. else the cores this process may run on (``os.sched_getaffinity``), shared fairly with the other
   solbench runs on this machine: each run claims cores through one lock file per core
   (``fcntl`` locks, released by the kernel when a process dies, so a killed run frees its cores),
   pins itself to the cores it claimed and uses that many threads. A run that finds every core
   claimed takes one thread: the runs already going keep their cores, so the machine is
   oversubscribed by one thread, not by a whole second pool. Cores that other programs keep busy
   (read from /proc/stat over a quarter second) are left to them: a run on 2 cores beside one busy
   process takes 1 thread. Measured on 2 cores beside other jobs: a tiny-model Sol-RL iteration took
   about 60 s with 2 threads and 5 s with 1, because every OpenMP region of 2 threads waits for the
   core the other job holds.

The count used is recorded in each run's env.json (``torch_threads``, ``cpu_allocation``), so its
timings say what they ran on.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

ENV_THREADS = "SOLBENCH_THREADS"
#: Set by the launcher inside a local worker process: which worker it is and its cores.
LOCAL_WORKER_ENV = "SOLBENCH_LOCAL_WORKER"
#: Where the per-core lock files live (one folder per user, shared by every solbench process).
LOCK_DIR_ENV = "SOLBENCH_CORE_LOCKS"


@dataclass
class CpuAllocation:
    """What one run uses: ``threads`` torch threads, pinned to ``cores`` when it claimed them."""

    threads: int
    source: str  # "explicit" | "recorded" | "recorded, fewer cores" | "slurm" | "claimed" | "all cores taken"
    cores: list[int] = field(default_factory=list)
    # the local worker process this run executes in (solbench.launch), None outside one
    local_worker: str | None = field(default_factory=lambda: os.environ.get(LOCAL_WORKER_ENV) or None)

    def as_dict(self) -> dict:
        out = asdict(self)
        if out["local_worker"] is None:
            del out["local_worker"]
        return out


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity mask; every core where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity masks
        return list(range(os.cpu_count() or 1))


def requested_threads(explicit: int | None = None) -> tuple[int | None, str]:
    """(threads, source) from an explicit setting or Slurm; (None, "") when neither says."""
    if explicit is not None:
        if explicit < 1:
            raise ValueError(f"threads must be >= 1, got {explicit}")
        return explicit, "explicit"
    raw = os.environ.get(ENV_THREADS)
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{ENV_THREADS}={raw!r} is not a whole number of threads") from None
        if value < 1:
            raise ValueError(f"{ENV_THREADS}={raw!r}: need at least 1 thread")
        return value, "explicit"
    slurm = os.environ.get("SLURM_CPUS_PER_TASK")
    if slurm and slurm.isdigit() and int(slurm) > 0:
        return int(slurm), "slurm"
    return None, ""


def _lock_dir() -> Path:
    folder = Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / f"solbench-cores-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@contextlib.contextmanager
def claim_cores(cores: list[int], limit: int | None = None) -> Iterator[list[tuple[int, int]]]:
    """Lock as many of ``cores`` as are free (``limit`` at most); yields [(core, fd)] held until the block ends."""
    held: list[tuple[int, int]] = []
    folder = _lock_dir()
    try:
        for core in cores:
            if limit is not None and len(held) >= limit:
                break
            fd = os.open(folder / f"core{core}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            held.append((core, fd))
        yield held
    finally:
        for _, fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)


@contextlib.contextmanager
def cpu_allocation(threads: int | None = None, *, device: str = "cpu",
                   recorded: int | None = None) -> Iterator[CpuAllocation]:
    """Set torch's thread count (and, for claimed cores, the affinity) for one run; restore both after.

    ``recorded``: the thread count the run's first attempt used (a resume), taken unless an explicit
    setting asks for another; with fewer cores than that here, one thread per core (source "recorded,
    fewer cores": the resume cannot reproduce the run's numbers, and its launcher says so). It claims
    and pins to as many free cores as it uses threads where they are free.

    On CUDA the count still matters (data preparation, rewards on CPU) but cores are not claimed:
    one GPU run per Slurm task is the rule there.
    """
    import torch

    before_threads = torch.get_num_threads()
    before_affinity = available_cores()
    count, source = requested_threads(threads)
    if recorded is not None and source != "explicit":
        count, source = ((recorded, "recorded") if recorded <= len(before_affinity)
                         else (len(before_affinity), "recorded, fewer cores"))
    try:
        if source.startswith("recorded") and device == "cpu":
            with claim_cores(before_affinity, limit=count) as held:
                cores = [core for core, _ in held] if len(held) == count else []
                if cores:
                    _set_affinity(cores)
                alloc = CpuAllocation(count, source, cores)
                torch.set_num_threads(alloc.threads)
                yield alloc
            return
        if count is not None or device != "cpu":
            alloc = CpuAllocation(count or max(1, len(before_affinity)), source or "device")
            torch.set_num_threads(alloc.threads)
            yield alloc
            return
        with claim_cores(before_affinity) as held:
            if held:
                cores = [core for core, _ in held]
                free = max(1, len(cores) - round(busy_cores(cores)))
                alloc = CpuAllocation(free, "claimed" if free == len(cores) else "claimed, others busy", cores)
                _set_affinity(cores)
            else:
                alloc = CpuAllocation(1, "all cores taken")
                log.warning("every core of this machine is claimed by other solbench runs; running on 1 thread")
            torch.set_num_threads(alloc.threads)
            yield alloc
    finally:
        torch.set_num_threads(before_threads)
        _set_affinity(before_affinity)


def cpu_times(cores) -> dict[int, tuple[int, int]]:
    """{core: (total, idle + iowait)} in clock ticks since boot, from /proc/stat (OSError where unreadable)."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            values = [int(v) for v in fields]
            idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
            out[int(name[3:])] = (sum(values[:8]), idle)
    return out


def busy_cores(cores: list[int], seconds: float = 0.25) -> float:
    """How many of ``cores`` other programs keep busy now (0 where /proc/stat is not readable).

    Sampled while this run has not started computing, so the busy time is other processes'.
    """
    try:
        first = cpu_times(cores)
        time.sleep(seconds)
        second = cpu_times(cores)
    except (OSError, ValueError, IndexError):
        return 0.0
    busy = 0.0
    for core, (total, idle) in second.items():
        if core in first:
            d_total, d_idle = total - first[core][0], idle - first[core][1]
            busy += (d_total - d_idle) / d_total if d_total > 0 else 0.0
    return busy


def _set_affinity(cores: list[int]) -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, cores)
