"""Shared test setup: offline, deterministic, and small enough for 2 CPU cores."""

import os

# Never touch the network: a missing model must fail at once, not after 30 s of hub retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Local launches execute their runs in this process, one after another, where tests can monkeypatch
# them; tests of the worker processes (test_launch.py) set SOLBENCH_WORKERS themselves.
os.environ.setdefault("SOLBENCH_WORKERS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _backend_availability_decided_per_test():
    """Whether a quantization backend runs here is decided once per process (solbench.quant.registry); tests fake
    the machine (no TE, no bf16 units, no CUDA) with monkeypatch, so each starts with nothing decided."""
    from solbench.quant import registry

    registry.clear_cache()
    yield



def pytest_report_header(config):
    """The CPU the tests ran on: bit-identity across ranks is asserted only where its kernels
    compute a sample alike in any batch (tests/_cpu.py)."""
    import platform

    model = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as handle:
            model = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), model)
    return f"cpu: {model}"


def pytest_terminal_summary(terminalreporter):
    """Which mode the rank-vs-process and batch-invariance comparisons ran in (shown even with -q)."""
    from _cpu import COMPARISONS, gemm_rows_invariant

    if COMPARISONS:
        counts = ", ".join(f"{n} {mode}" for mode, n in sorted(COMPARISONS.items()))
        why = "row-invariant" if gemm_rows_invariant() else "row-count dependent"
        terminalreporter.write_line(f"same-numbers comparisons: {counts} (this CPU's GEMM is {why}; tests/_cpu.py)")
