"""Bounds on a tiny model config read from a file (``tiny_t2i.json`` in a ``model.path`` folder), checked before
anything is built: a folder from anyone cannot make a run allocate more than a tiny model needs.

``config_problem`` names every field that is not a whole number within its bound (``BOUNDS``: layers, widths,
heads, head dim, text sizes), a vocabulary past ``MAX_VOCABULARY`` words and an estimated parameter count past
``MAX_PARAMETERS``, and always says the estimate (``estimated_parameters``: exact for the FluxTransformer2DModel
and text encoder solbench.models.tiny builds, counted from the sizes without building anything).
``read_config`` reads the JSON itself, at most ``MAX_CONFIG_BYTES`` of it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from solbench.text.bounded_text import clip, decode_text, read_at_most

#: Largest value of each size of a tiny config (the shipped model: 2 + 2 layers, 8 heads of 32, text 64 wide).
BOUNDS = {
    "resolution": 512, "channels": 16, "patch_size": 64, "num_layers": 64, "num_single_layers": 64,
    "num_attention_heads": 64, "attention_head_dim": 512, "text_dim": 4096, "text_heads": 64, "text_layers": 32,
    "max_length": 512,
}
#: Words a tiny tokenizer may have (the shipped one has 21), and characters a word may have.
MAX_VOCABULARY, MAX_WORD = 100_000, 100
#: Parameters a tiny config may build (2 GB of float32 weights; the shipped model has 7.1 million).
MAX_PARAMETERS = 500_000_000
#: Bytes of a tiny_t2i.json (the shipped one has about 1 KB).
MAX_CONFIG_BYTES = 1024 * 1024


def estimated_parameters(sizes: dict[str, Any]) -> int:
    """Parameters of the transformer and text encoder a config of these ``sizes`` builds (every BOUNDS key,
    and ``vocabulary``: the words, or their number)."""
    hd, t = sizes["attention_head_dim"], sizes["text_dim"]
    d = sizes["num_attention_heads"] * hd  # the transformer's width
    c, f = sizes["channels"] * sizes["patch_size"] ** 2, 4 * d  # a token's channels; the MLP width (ratio 4)
    double = 2 * (6 * d * d + 6 * d) + 8 * (d * d + d) + 4 * hd + 2 * (2 * d * f + f + d)  # adaLN x2, attention, MLP x2
    single = (3 * d * d + 3 * d) + (d * f + f) + 3 * (d * d + d) + ((d + f) * d + d) + 2 * hd
    embed = (c * d + d) + (t * d + d) + (256 * d + d + d * d + d) + (t * d + d + d * d + d)  # x, context, time, text
    out = (2 * d * d + 2 * d) + (d * c + c)
    vocabulary = sizes["vocabulary"]
    words = (vocabulary if isinstance(vocabulary, int) else len(vocabulary)) + 2  # <pad> and <unk>
    text = words * t + sizes["max_length"] * t + sizes["text_layers"] * (12 * t * t + 13 * t) + 2 * t
    return sizes["num_layers"] * double + sizes["num_single_layers"] * single + embed + out + text


def config_problem(data: Any, defaults: dict[str, Any]) -> str | None:
    """Why ``data`` (a parsed tiny_t2i.json; ``defaults``: TinyT2IConfig's fields) is no tiny config within the
    bounds, with the parameter count it would build; None when it is one."""
    if not isinstance(data, dict):
        return f"a tiny config is a JSON object of sizes, got {type(data).__name__}"
    problems, sizes = [], dict(defaults)
    for key, bound in BOUNDS.items():
        value = data.get(key, defaults[key])
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            problems.append(f"{key} {clip(value, 40)} (a whole number from 1 to {bound:,})")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            sizes[key] = value  # the estimate counts what the file asks for
    vocabulary = data.get("vocabulary", defaults["vocabulary"])
    if not isinstance(vocabulary, list) or len(vocabulary) > MAX_VOCABULARY or not all(
            isinstance(word, str) and 0 < len(word) <= MAX_WORD for word in vocabulary[:MAX_VOCABULARY]):
        problems.append(f"vocabulary (a list of at most {MAX_VOCABULARY:,} words of 1 to {MAX_WORD} characters)")
    else:
        sizes["vocabulary"] = len(vocabulary)
    axes = data.get("axes_dims_rope", defaults["axes_dims_rope"])
    if not (isinstance(axes, (list, tuple)) and len(axes) == 3 and all(
            isinstance(a, int) and not isinstance(a, bool) and a > 0 for a in axes)
            and sum(axes) == sizes["attention_head_dim"]):
        problems.append(f"axes_dims_rope {clip(axes, 40)} (3 positive whole numbers summing to attention_head_dim "
                        f"{clip(sizes['attention_head_dim'], 20)})")
    parameters = estimated_parameters(sizes)
    past = parameters > MAX_PARAMETERS
    if not problems and not past:
        return None
    what = "; ".join(problems) + ": " if problems else ""
    return (f"{what}the config would build about {parameters:,} parameters ({parameters * 4 / 1e9:,.1f} GB of float32 "
            f"weights){f', past the bound of {MAX_PARAMETERS:,}' if past else ''}; the shipped tiny model has "
            "7.1 million")


def read_config(path: str | Path) -> tuple[Any, str | None]:
    """(parsed JSON, None) of a tiny_t2i.json, or (None, why it cannot be read: too large, not UTF-8 JSON)."""
    try:
        raw = read_at_most(path, MAX_CONFIG_BYTES)
    except OSError as err:
        return None, f"cannot read {path}: {err.strerror}"
    if raw is None:
        return None, f"{path} has more than {MAX_CONFIG_BYTES // 1024} KiB, the bound on a tiny config's size"
    try:
        return json.loads(decode_text(raw)), None
    except (UnicodeDecodeError, ValueError) as err:
        return None, f"{path} is not a JSON config ({clip(err, 80)})"
