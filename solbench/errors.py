"""User-facing errors: the CLI prints their message (what is wrong and where) without a traceback."""


class SolbenchError(Exception):
    """Base class for errors caused by input or environment, not by a bug in solbench."""


class ConfigError(SolbenchError):
    """A spec, config or argument is invalid. The message names the file and key path."""


class MissingWeightsError(SolbenchError):
    """Model or reward weights are not on this machine. The message says which and how to get them."""


class UnsupportedHardwareError(SolbenchError):
    """The requested precision/backend cannot run here. The message says what hardware/package it needs."""


class NonFiniteLossError(SolbenchError):
    """A training loss or gradient became NaN/inf; the run stops instead of silently zeroing it."""


class StorageError(SolbenchError):
    """A file could not be written: the disk is full, or the folder is read-only or not ours. The message names the file."""
