"""`NonFiniteError` and its message: what `quantize`/`fake_quantize` raise on NaN/inf input.

One job: name the non-finite values of an input (count, NaN vs inf, first index) when the
nonfinite policy is 'error'. A leaf module, so that the format modules (`nvfp4`, `mxfp4`, `fp8`)
can raise it without importing `formats`, which imports them; `formats` re-exports both names.
"""

from __future__ import annotations

import numpy as np
import torch


class NonFiniteError(ValueError):
    """Raised by `quantize`/`fake_quantize` when the input has NaN or inf and nonfinite='error'."""


def _raise_nonfinite(view: torch.Tensor, fmt: str, shape: torch.Size) -> None:
    """Raise NonFiniteError for the non-finite values of `view`, the [rows, K (+ zero padding)]
    view of a tensor of `shape`; the first bad index is reported in `shape`'s coordinates."""
    bad = ~torch.isfinite(view)
    count = int(bad.sum())
    n_nan = int(torch.isnan(view).sum())
    row, col = (int(i) for i in bad.nonzero()[0])
    first = tuple(int(i) for i in np.unravel_index(row, tuple(shape[:-1]))) + (col,)
    raise NonFiniteError(
        f"quantize(fmt={fmt!r}): input of shape {tuple(shape)} has {count} non-finite value(s) "
        f"({n_nan} NaN, {count - n_nan} inf), first at index {first}. No {fmt} element encodes "
        "NaN/inf. Find where they come from, or pass nonfinite='propagate' to quantize the rest "
        "and mark the affected blocks as NaN."
    )
