"""Peak memory of a block of code: what one phase of a run allocates at most.

On a GPU this is the caching allocator's own statistic (``torch.cuda.max_memory_allocated``, reset
when the block starts), the number a run out of memory is about. On CPU there is no such counter,
so ``PeakMemory`` counts tensor storages instead: a TorchDispatchMode sees every op's outputs inside
the block, keeps a weak reference to each new storage, and after every op adds up the bytes of the
storages still alive. The CPU figure is the peak of what the block allocated and still held
(tensors made before the block are not counted), which is how the tests catch a transient copy at
tiny shapes; it slows the block down (Python work per op), so it is for tests and tiny runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["PeakMemory"]


def _counted(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta


class _StorageCensus(TorchDispatchMode):
    """Live bytes of the storages created by ops run under this mode, and their peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        # storages the op received already existed (made before the block, or counted when made)
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if _counted(t)}
        out = func(*args, **kwargs)
        self._drop_freed()  # what was released before or during this op
        for t in tree_leaves(out):
            if _counted(t):
                storage = t.untyped_storage()
                key = storage._cdata
                if key not in self.live and key not in inputs:
                    self.live[key] = (StorageWeakRef(storage), storage.nbytes())
                    self.current += storage.nbytes()
        self.peak = max(self.peak, self.current)
        return out

    def _drop_freed(self) -> None:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            self.current -= self.live.pop(key)[1]


@dataclass
class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.bytes``: the most the block held at once.

    CUDA: ``torch.cuda.max_memory_allocated`` over the block (everything allocated, including
    what was allocated before the block and is still alive; ``baseline`` says how much that was).
    CPU: the storages the block's ops created, at their peak (``baseline`` 0).
    """

    device: torch.device | str = "cpu"
    bytes: int = 0
    baseline: int = 0

    def __enter__(self) -> "PeakMemory":
        self.device = torch.device(self.device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline = torch.cuda.memory_allocated(self.device)
        else:
            from solbench.quant import fused

            self._eager = fused.eager_only()  # torch.compile cannot trace under the census
            self._eager.__enter__()
            self._census = _StorageCensus()
            self._census.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._census.__exit__(*exc)
            self._eager.__exit__(*exc)
            self.bytes = self._census.peak

    @property
    def above_baseline(self) -> int:
        """What the block added at its peak to what was held when it started."""
        return self.bytes - self.baseline
