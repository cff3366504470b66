"""Several processes (GPUs) within one run: torch.distributed, owned by the harness.

The paper's setting is 8 GPUs per run. solbench splits a run's work over ranks like this:

- Rollouts are sharded by sample: every rank asks the engine for the same global list of
  (prompt, candidate) pairs; rank r computes the contiguous shard ``shard(n)`` of it. Noise is a pure
  function of (run seed, prompt, candidate), so a sample comes out the same on any rank.
- Latents and trajectories are gathered when something reads them (``ShardedRows`` in a
  ``Gathered`` field of Rollout / Trajectory), and only the rows read: Sol-RL's explore latents are
  never gathered (only their rewards are), naive FP4's only for the K kept, FlowGRPO's per-step
  means not at all. Decoded images stay on the rank that made them (they are the large part) and
  rewards are gathered after scoring. Reads happen in method code every rank runs identically
  (collect, chunks), so every rank joins every gather in the same order.
- So per-prompt groups, advantages and Sol-RL's top/bottom selection are computed on the global
  batch, identically on every rank, by unchanged method code.
- Training: the method's chunks (micro-batches x timesteps) are dealt round-robin over ranks, and
  gradients are summed over ranks (all-reduce) before each optimizer step. The update therefore equals
  one process working through every chunk, up to float summation order.

Plain DDP is not used because ranks may run different numbers of backward passes per optimizer
step (a chunk count that does not divide by the world size); the explicit all-reduce does not care.

Processes come from torchrun (RANK/WORLD_SIZE/MASTER_ADDR in the environment) or from Slurm through
submitit (a launch profile with ``tasks_per_node``); ``init_distributed`` finds out which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from solbench.errors import ConfigError

__all__ = ["DistContext", "Gathered", "ShardedRows", "cat_rows", "take_rows", "init_distributed", "join_launch_group",
           "launch_rank", "SINGLE"]


@dataclass
class DistContext:
    """This process's place in a run: rank, world size, and the collectives the harness uses."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # this context initialised the process group (and destroys it)
    _backend: str = field(default="", repr=False)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int, rank: int | None = None) -> slice:
        """The contiguous rows of an n-row request that ``rank`` (default: this rank) computes."""
        rank = self.rank if rank is None else rank
        base, extra = divmod(n, self.world_size)
        start = rank * base + min(rank, extra)
        return slice(start, start + base + (1 if rank < extra else 0))

    # -- collectives (no-ops for a single process) --------------------------------------------
    def gather_rows(self, local: Tensor, n: int) -> Tensor:
        """Concatenate every rank's shard of an n-row tensor (rank order), on every rank."""
        if not self.enabled:
            return local
        import torch.distributed as dist

        return ShardedRows.from_shards(self, local, n).gather()

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's (picklable) ``obj``, in rank order."""
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on some rank."""
        if not self.enabled:
            return flag
        import torch.distributed as dist

        device = torch.device("cuda", torch.cuda.current_device()) if self._backend == "nccl" else torch.device("cpu")
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item() > 0)

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """All-reduce (sum) the gradients of ``params``; a rank without a gradient contributes zeros."""
        if not self.enabled:
            return
        import torch.distributed as dist

        handles = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            handles.append(dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, async_op=True))
        for handle in handles:
            handle.wait()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's (picklable) ``obj`` on every rank."""
        if not self.enabled:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    def close(self, *, synchronize: bool = True) -> None:
        """Tear down the process group this context created. ``synchronize`` (a rank that ends normally)
        first waits at a barrier for every rank: a rank that destroyed its group and exited while another was
        still in its last collective made that rank's gloo thread abort it ("terminate called without an
        active exception", exit -6) at the very end of a finished run. A rank ending on an error skips it."""
        if self.owns_group:
            import torch.distributed as dist

            if dist.is_initialized():
                if synchronize:
                    self.barrier()
                dist.destroy_process_group()
            self.owns_group = False


SINGLE = DistContext()


class ShardedRows:
    """An n-row tensor whose rows are spread over the ranks, gathered only when read.

    ``owners[r]`` lists the global positions rank r holds, in the order of its local rows (this
    rank's are ``local``). ``index`` selects rows without communicating (every rank knows where
    each row lives); ``gather`` all-gathers just the rows the selection kept. Every rank must call
    ``gather`` on the same selections in the same order (a collective).
    """

    def __init__(self, dist: DistContext, local: Tensor, owners: list[list[int]]) -> None:
        self.dist, self.local, self.owners = dist, local, owners
        self.n = sum(len(o) for o in owners)

    @classmethod
    def from_shards(cls, dist: DistContext, local: Tensor, n: int) -> "ShardedRows":
        """Rank r holds the contiguous shard ``dist.shard(n, r)`` (how the engine splits a rollout)."""
        return cls(dist, local, [list(range(s.start, s.stop)) for s in (dist.shard(n, r) for r in range(dist.world_size))])

    def __len__(self) -> int:
        return self.n

    def index(self, positions) -> "ShardedRows":
        """The rows at ``positions`` (global, in that order; repeats allowed), still spread over the ranks."""
        positions = [int(p) for p in positions]
        where = {pos: (r, i) for r, held in enumerate(self.owners) for i, pos in enumerate(held)}
        owners: list[list[int]] = [[] for _ in self.owners]
        mine = []
        for new, old in enumerate(positions):
            rank, i = where[old]
            owners[rank].append(new)
            if rank == self.dist.rank:
                mine.append(i)
        local = self.local[torch.tensor(mine, dtype=torch.long, device=self.local.device)]
        return ShardedRows(self.dist, local, owners)

    @classmethod
    def cat(cls, parts: list["ShardedRows"]) -> "ShardedRows":
        owners: list[list[int]] = [[] for _ in parts[0].owners]
        offset = 0
        for part in parts:
            for r, held in enumerate(part.owners):
                owners[r] += [offset + pos for pos in held]
            offset += part.n
        return cls(parts[0].dist, torch.cat([part.local for part in parts]), owners)

    def gather(self) -> Tensor:
        """The whole n-row tensor on every rank."""
        if not self.dist.enabled:
            return self.local
        import torch.distributed as dist

        counts = [len(o) for o in self.owners]
        widest = max(counts)
        local = self.local
        padded = local.new_zeros((widest, *local.shape[1:]))
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.dist.world_size)]
        dist.all_gather(parts, padded.contiguous())
        out = local.new_empty((self.n, *local.shape[1:]))
        for r, (part, held) in enumerate(zip(parts, self.owners)):
            if held:
                out[torch.tensor(held, dtype=torch.long, device=out.device)] = part[: len(held)]
        return out


class Gathered:
    """A dataclass field holding a Tensor (or None) or a ShardedRows, gathered the first time it is read.

    ``x0: Tensor = Gathered()`` in a dataclass: construction and assignment store the value as given;
    reading a ShardedRows gathers it (a collective: every rank reads the same fields in the same
    order) and keeps the tensor. ``obj.__dict__[name]`` is the value as stored, not gathered.
    """

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:  # no class-level default: the dataclass field stays required
            raise AttributeError(self.name)
        value = obj.__dict__[self.name]
        if isinstance(value, ShardedRows):
            value = obj.__dict__[self.name] = value.gather()
        return value

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else None


def init_distributed(world_size: int, device_type: str = "cpu") -> DistContext:
    """The DistContext of a run with ``world_size`` ranks, joining or creating the process group.

    World size 1 is a plain single process (and an error inside a multi-process launch, where every
    process would otherwise train and write the same run). Otherwise: an already initialised
    process group is used as is; torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR) or a Slurm
    job started by submitit with one task per rank is joined. The backend is NCCL on CUDA, gloo on CPU.
    """
    import torch.distributed as dist

    launched = _env_int("WORLD_SIZE") or (_env_int("SLURM_NTASKS") if "SUBMITIT_EXECUTOR" in os.environ else None)
    if world_size == 1:
        if launched and launched > 1:
            raise ConfigError(f"this process is one of {launched} ranks (torchrun/Slurm tasks), but the run has "
                              "world_size=1; set world_size in the spec or start a single process")
        return SINGLE
    backend = "nccl" if device_type == "cuda" else "gloo"
    owns = False
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ and "SLURM_JOB_ID" in os.environ and "SUBMITIT_EXECUTOR" in os.environ:
            from submitit.helpers import TorchDistributedEnvironment

            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        if not all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
            raise ConfigError(
                f"world_size={world_size}: this run needs {world_size} processes, one per GPU. Start it with "
                f"`torchrun --nproc-per-node {world_size} -m solbench run SPEC` or through Slurm with a launch "
                f"profile whose tasks_per_node x nodes = {world_size} (slurm/profiles/gpu.yaml)")
        dist.init_process_group(backend=backend, init_method="env://")
        owns = True
    actual = dist.get_world_size()
    if actual != world_size:
        if owns:
            dist.destroy_process_group()
        raise ConfigError(f"world_size={world_size} in the run config, but {actual} processes were started; "
                          f"start {world_size} (torchrun --nproc-per-node / Slurm tasks) or change world_size")
    local_rank = _env_int("LOCAL_RANK") or 0
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    return DistContext(rank=dist.get_rank(), world_size=actual, local_rank=local_rank, owns_group=owns,
                       _backend=dist.get_backend())


def launch_rank() -> int:
    """This process's rank in a torchrun launch (0 when not launched by torchrun)."""
    return _env_int("RANK") or 0


def join_launch_group() -> DistContext:
    """For `solbench run` started by torchrun: one process group shared by every run of the spec.

    Rank 0 plans and records; the others follow its plan (DistContext.broadcast), so all ranks
    execute the same runs in the same order. A single process gets SINGLE.
    """
    import torch.distributed as dist

    world = _env_int("WORLD_SIZE") or 1
    if world == 1 or dist.is_initialized():
        return SINGLE
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(_env_int("LOCAL_RANK") or 0)
    dist.init_process_group(backend="nccl" if cuda else "gloo", init_method="env://")
    return DistContext(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=_env_int("LOCAL_RANK") or 0,
                       owns_group=True, _backend=dist.get_backend())


def take_rows(value, positions: Tensor):
    """Rows ``positions`` (a long tensor) of a Tensor, None or ShardedRows, without gathering."""
    if value is None:
        return None
    if isinstance(value, ShardedRows):
        return value.index(positions.tolist())
    return value[positions.to(value.device)]


def cat_rows(values: list):
    """Concatenate Tensors or ShardedRows (all of one kind) along rows; None if any is None."""
    if any(v is None for v in values):
        return None
    if any(isinstance(v, ShardedRows) for v in values):
        return ShardedRows.cat(values)
    return torch.cat(values)
