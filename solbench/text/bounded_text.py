"""Text from outside the program (specs, results tables, prompt files, spec.json) bounded where it is read and
where it is printed: ``read_at_most`` reads a file only up to a bound (whatever it is: a FIFO or /dev/zero
reports no size), and ``clip`` keeps the first characters of a long string and says how long it was, so that a
10 MB metric name or prompt costs a log line, a CLI table cell or an error message no more than a short one does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Characters of an outside string a line prints (a metric name, a prompt, a path read from a results folder).
CLIP_CHARS = 120


def clip(value: Any, limit: int = CLIP_CHARS) -> str:
    """``str(value)``, or its first ``limit`` characters and how many it has (``'abc... (10,000,000 characters)'``).
    Only the kept characters are converted where ``value`` is a string."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"


def clip_repr(value: Any, limit: int = CLIP_CHARS) -> str:
    """``repr`` of a string, clipped as ``clip`` clips (the quotes show where a kept part begins and ends)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def clip_end(value: Any, limit: int = CLIP_CHARS) -> str:
    """As ``clip``, keeping the last ``limit`` characters (a traceback's end says what failed)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= limit:
        return text
    return f"({len(text):,} characters; the last {limit:,}:) ...{text[-limit:]}"


def read_at_most(path: str | Path, limit: int) -> bytes | None:
    """The bytes of ``path``, or None when it has more than ``limit`` (read ``limit`` + 1 of them at most, a
    megabyte at a time). OSError as ``open`` raises it."""
    chunks, size = [], 0
    with open(path, "rb") as handle:
        while size <= limit:
            chunk = handle.read(min(2**20, limit + 1 - size))
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            size += len(chunk)
    return None


def decode_text(raw: bytes, encoding: str = "utf-8") -> str:
    """``raw`` decoded as ``open(path, encoding=encoding)`` reads a file: \\r\\n and \\r read as \\n
    (UnicodeDecodeError where it is not that encoding)."""
    return raw.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")  # (the error's offset: in all of raw)
