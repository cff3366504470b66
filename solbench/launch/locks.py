"""The run lock: one process executes a run at a time.

``execute_run`` holds an exclusive ``flock`` on ``<run_dir>/.lock`` while it runs (released by the OS
however the process ends), so a resubmission that races a dying job waits for it, ``prepare_run``
touches a run's folder only when it can take the lock, and ``run_states`` reads a free lock as "no
process executes this run".
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_lock(run_dir: str | Path, wait_s: float = 0.0) -> Iterator[bool]:
    """Hold the run's exclusive lock for the block; yields False if it stayed taken for wait_s."""
    path = Path(run_dir) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # never through a link: the lock is truncated and written below
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise
        from solbench.errors import StorageError

        raise StorageError(f"{path} is a symbolic link (to {os.readlink(path)}); solbench writes only inside the "
                           "run folder: remove the link and run again") from None
    deadline = time.monotonic() + wait_s
    acquired = False
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                acquired = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.5)
        if acquired:
            os.ftruncate(fd, 0)
            os.write(fd, f"{socket.gethostname()} {os.getpid()}\n".encode())
        yield acquired
    finally:
        if acquired:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def lock_is_held(run_dir: str | Path) -> bool:
    """True while some process (this one included) executes the run."""
    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
