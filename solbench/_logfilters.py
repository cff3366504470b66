"""Drop the import-time log lines of torchao that reach every user's screen, and nothing else.

diffusers probes torchao (a test-only dependency that the main install brings in) when it loads a
model: torchao logs a failed load of each CUDA extension it ships (a CPU-only torch cannot load
them), torch's pytree logs a deprecation for each of torchao's enums, and diffusers logs that it
cannot import torchao's tensor types. None of it concerns solbench, which does not use torchao.
Each filter sits on the one logger that emits the line and drops only that line, so every other
warning of these libraries still shows.
"""

from __future__ import annotations

import logging

# (logger name, a fragment of the message that identifies the line)
_NOISE = (
    ("torchao", "Failed to load"),  # torchao/__init__.py: an _C*.so extension built for CUDA
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),  # torchao's enums
    ("diffusers.quantizers.torchao.torchao_quantizer", "Unable to import `torchao` Tensor objects"),
)


class _DropMessage(logging.Filter):
    def __init__(self, fragment: str) -> None:
        super().__init__()
        self.fragment = fragment

    def filter(self, record: logging.LogRecord) -> bool:
        return self.fragment not in record.getMessage()


def install() -> None:
    """Attach the filters (idempotent; loggers need not exist yet, getLogger creates them)."""
    for name, fragment in _NOISE:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessage) and f.fragment == fragment for f in logger.filters):
            logger.addFilter(_DropMessage(fragment))
