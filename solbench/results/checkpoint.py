"""What a checkpoint file holds, and how one is read: tensors and plain data only, never code.

A checkpoint (``checkpoints/step_<step>.pt``) is ``{"step": int, "state": dict}`` written by ``torch.save``,
where the state holds tensors, dicts, lists, tuples, str, int, float, bool and None only (``plain_problem``
says what else a state holds; ``RunStore.save_checkpoint`` refuses such a state). It is read with
``torch.load(weights_only=True)`` (``read_checkpoint``), which builds nothing else: a file whose pickle names
any other class or function (a crafted ``__reduce__``, or a checkpoint of solbench before issue 47, which
held numpy's RNG state as an array) is not loaded but reported as unreadable, as a truncated file is, and the
previous checkpoint is used. Random-number generator states are stored as plain data (``rng_state``,
``set_rng_state``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from solbench.errors import SolbenchError

_PLAIN = (bool, int, float, str, type(None))


class UnreadableCheckpoint(SolbenchError):
    """A checkpoint file that does not load as tensors and plain data, or lacks what its reader needs."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def plain_problem(value: Any, where: str = "state") -> str | None:
    """Where ``value`` holds something other than tensors and plain data (``weights_only`` would refuse
    to load it), e.g. ``"state.rng.numpy[1] is a numpy.ndarray"``; None when it holds nothing else."""
    import torch

    if isinstance(value, torch.Tensor) or isinstance(value, _PLAIN):
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int)):
                return f"{where} has a key of type {type(key).__name__}"
            problem = plain_problem(item, f"{where}.{key}")
            if problem:
                return problem
        return None
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            problem = plain_problem(item, f"{where}[{index}]")
            if problem:
                return problem
        return None
    return f"{where} is a {type(value).__module__}.{type(value).__qualname__}"


def read_checkpoint(path: str | Path, check: Callable[[dict], str | None] | None = None) -> tuple[int, dict]:
    """(step, state) of a checkpoint file, loaded with ``weights_only=True``; UnreadableCheckpoint, naming the
    file, when it does not load so or lacks a step and state, or when ``check(state)`` names what it lacks."""
    import pickle

    import torch

    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        text = " ".join(str(err).split())
        named = re.search(r"GLOBAL ([\w.]+)", text)
        if named:
            raise UnreadableCheckpoint(
                path, f"its pickle names {named.group(1)}, more than tensors and plain data, so it is not loaded "
                "(loading it could run code); a checkpoint of solbench before issue 47 (rerun that run from scratch: "
                f"`solbench run SPEC --force --only {path.parent.parent.name}`), or no checkpoint at all") from None
        # torch's own text here suggests weights_only=False: never, for a file from a results folder
        raise UnreadableCheckpoint(path, "not a checkpoint file (cut short or damaged)") from None
    except Exception as err:  # noqa: BLE001 - a truncated zip, an empty file, an I/O error: all unreadable
        raise UnreadableCheckpoint(path, f"cannot be read ({type(err).__name__}: {' '.join(str(err).split())[:160]})") \
            from None
    if not isinstance(payload, dict) or not isinstance(payload.get("step"), int) or isinstance(payload["step"], bool) \
            or not isinstance(payload.get("state"), dict):
        raise UnreadableCheckpoint(path, "not a solbench checkpoint (no integer 'step' and 'state' mapping)")
    problem = check(payload["state"]) if check is not None else None
    if problem:
        raise UnreadableCheckpoint(path, problem)
    return payload["step"], payload["state"]


def missing_keys(state: dict, required: dict[str, Any]) -> str | None:
    """What of ``required`` (key -> nested required keys, or None) ``state`` lacks, e.g. ``"the checkpoint lacks
    'nets.trainable'"``; None when it has them all."""

    def walk(node: Any, wanted: dict[str, Any], prefix: str) -> str | None:
        for key, inner in wanted.items():
            if not isinstance(node, dict) or key not in node:
                return f"{prefix}{key}"
            if inner:
                found = walk(node[key], inner, f"{prefix}{key}.")
                if found:
                    return found
        return None

    lacking = walk(state, required, "")
    return f"the checkpoint lacks {lacking!r}" if lacking else None


def rng_state() -> dict:
    """The global RNG states (torch, numpy, Python, CUDA) as tensors and plain data."""
    import numpy as np
    import torch

    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss = random.getstate()
    state = {"torch": torch.get_rng_state(),
             "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
             "python": {"version": int(version), "internal": list(internal), "gauss": gauss}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what ``rng_state`` saved."""
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["kind"], numpy_state["keys"].numpy().astype(np.uint32), numpy_state["pos"],
                         numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"]), python["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
