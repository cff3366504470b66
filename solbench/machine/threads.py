"""CPU threads of a run: the count its config sets, on cores of its own where they are free.

A run's intra-op thread count changes its numbers on CPU (a GEMM or a reduction split over 2 threads
adds in another order than over 1), so it is a setting of the run, ``numerics.threads`` (solbench.config,
part of the run id; default 1), and nothing about the machine changes it: not its core count, not how
busy it is, not ``--workers`` nor how many runs are left. What the machine decides is only where a run's
threads go:

- each run claims as many free cores as it has threads, through one lock file per core (``fcntl``
  locks, released by the kernel when a process dies, so a killed run frees its cores), and pins itself
  to them; a local worker process (solbench.launch.local) claims within its share of the cores;
- where fewer are free (other solbench runs hold them) it runs unpinned on the same thread count: the
  same numbers, more slowly, and its timings carry the load the others put on its cores (solbench.engine.timing);
- where the run may use fewer cores than its threads (a small machine, a Slurm task with fewer
  ``--cpus-per-task``) the setting cannot be had without oversubscribing the cores (every OpenMP region
  then waits out a scheduler time slice: issue 17 measured 30-75x slowdowns): it runs one thread per core
  (source "fewer cores") and its launcher says so in one line and records it (solbench.machine.numerics).

The allocation is recorded in each run's env.json (``torch_threads``, ``cpu_allocation``), so its timings
say what they ran on. ``SOLBENCH_THREADS``, which once set the count from outside the spec, is refused
with a message that says where the setting lives now.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)

#: No longer read: a run's thread count is its config's ``numerics.threads``. Set, it is an error (``check_env``).
ENV_THREADS = "SOLBENCH_THREADS"
#: Set by the launcher inside a local worker process: which worker it is and its cores.
LOCAL_WORKER_ENV = "SOLBENCH_LOCAL_WORKER"
#: Where the per-core lock files live (one folder per user, shared by every solbench process).
LOCK_DIR_ENV = "SOLBENCH_CORE_LOCKS"
#: The most threads a run may set (numerics.threads, fidelity --threads): no CPU solbench runs on has more cores.
MAX_THREADS = 1024


@dataclass
class CpuAllocation:
    """What one run uses: ``threads`` torch threads, pinned to ``cores`` when it claimed them."""

    threads: int
    source: str  # "config" | "fewer cores" | "device"
    cores: list[int] = field(default_factory=list)
    # the local worker process this run executes in (solbench.launch), None outside one
    local_worker: str | None = field(default_factory=lambda: os.environ.get(LOCAL_WORKER_ENV) or None)
    wanted: int | None = None  # the config's count where it could not be had (source "fewer cores")

    def as_dict(self) -> dict:
        out = asdict(self)
        for key in ("local_worker", "wanted"):
            if out[key] is None:
                del out[key]
        return out

    def shortfall(self) -> str:
        """Why the config's thread count was not had ("" where it was), for numerics.differences."""
        if self.wanted is None:
            return ""
        return f"only {self.threads} core(s) here" + (" (Slurm --cpus-per-task)" if _slurm_cpus() else "")


def check_env() -> None:
    """Raise ValueError for SOLBENCH_THREADS (a count from outside the spec would change a run's numbers
    without its run id saying so) and for a SOLBENCH_CORE_LOCKS that cannot be a folder."""
    raw = os.environ.get(ENV_THREADS)
    if raw is not None:
        raise ValueError(f"{ENV_THREADS}={raw!r} is not read any more: a run's thread count is its spec's "
                         "numerics.threads (default 1, part of the run id); unset it and set that instead")
    problem = _lock_dir_problem(os.environ.get(LOCK_DIR_ENV))
    if problem:
        raise ValueError(problem)


def _lock_dir_problem(raw: str | None) -> str | None:
    """Why SOLBENCH_CORE_LOCKS=``raw`` cannot hold the core lock files (a path at or under a file), else None."""
    if not raw:
        return None
    for path in (Path(raw), *Path(raw).parents):
        if path.exists() or path.is_symlink():
            if path.is_dir():
                return None
            what = "is" if path == Path(raw) else f"is under {path}, which is"
            return (f"{LOCK_DIR_ENV}={raw!r} {what} not a folder: it names the folder of the per-core lock files "
                    "(solbench.machine.threads); point it at a folder or unset it")
    return None


def available_cores() -> list[int]:
    """The cores this process may run on (its affinity mask; every core where there is none)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS and Windows have no affinity masks
        return list(range(os.cpu_count() or 1))


def _slurm_cpus() -> int | None:
    raw = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def usable_cores() -> int:
    """How many cores a run here may keep busy: its affinity mask, and no more than Slurm's --cpus-per-task."""
    count = len(available_cores())
    slurm = _slurm_cpus()
    return max(1, min(count, slurm) if slurm else count)


def _lock_dir() -> Path:
    problem = _lock_dir_problem(os.environ.get(LOCK_DIR_ENV))
    if problem:  # library callers (the CLI refuses it at start, check_env)
        from solbench.errors import ConfigError

        raise ConfigError(problem)
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
def cpu_allocation(threads: int, *, device: str = "cpu") -> Iterator[CpuAllocation]:
    """Set torch's thread count to ``threads`` (a run's ``numerics.threads``) for one run, pinned to
    that many claimed cores where they are free; restore both after.

    Fewer usable cores than ``threads``: one thread per core (source "fewer cores", ``wanted`` the
    setting), which the caller reports. On CUDA no cores are claimed (one GPU run per Slurm task is the
    rule there) and the count only sizes the CPU-side work.
    """
    import torch

    if not 1 <= int(threads) <= MAX_THREADS:
        raise ValueError(f"numerics.threads must be >= 1 and <= {MAX_THREADS} (no CPU has more cores), got {threads}")
    before_threads = torch.get_num_threads()
    before_affinity = available_cores()
    usable = usable_cores()
    count, wanted = (int(threads), None) if int(threads) <= usable else (usable, int(threads))
    source = "config" if wanted is None else "fewer cores"
    try:
        if device != "cpu":
            alloc = CpuAllocation(count, "device" if wanted is None else source, wanted=wanted)
            torch.set_num_threads(alloc.threads)
            yield alloc
            return
        with claim_cores(before_affinity, limit=count) as held:
            cores = [core for core, _ in held] if len(held) == count else []
            if cores:
                _set_affinity(cores)
            else:
                log.info("fewer than %d of this process's cores are free of other solbench runs: running unpinned "
                         "on %d thread(s) (the same numbers; its timings say how busy its cores were)", count, count)
            alloc = CpuAllocation(count, source, cores, wanted=wanted)
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


def _set_affinity(cores: list[int]) -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, cores)
