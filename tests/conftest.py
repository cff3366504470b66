"""Shared test setup: offline, deterministic, and small enough for 2 CPU cores."""

import os

# Never touch the network: a missing model must fail at once, not after 30 s of hub retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True)
def _seed_everything():
    torch.manual_seed(0)
    yield
