"""Bounds on a real model's transformer config read from a local ``model.path`` folder (``transformer/config.json``),
checked before the pipeline is loaded: a folder from anyone cannot make a run build a transformer far larger than
the published one it stands for.

Each size of the published config (solbench.models.flops.REAL_MODELS: layers, heads, head dims, widths) may be at most
``GROWTH`` times its published value; past it ``config_problem`` names the sizes and the parameters the config would
build, estimated from the published count (depth and width scaled: parameters grow with the layers and the square
of the width), without building anything.
"""

from __future__ import annotations

from pathlib import Path

from solbench.text.bounded_text import clip
from solbench.models.tiny_bounds import read_config

#: How many times its published value a size of a local transformer config may be.
GROWTH = 2
#: The sizes compared (those of the published configs that count layers, heads or channels).
SIZES = ("num_layers", "num_single_layers", "num_attention_heads", "attention_head_dim", "joint_attention_dim",
         "caption_projection_dim", "pooled_projection_dim", "num_cross_attention_heads", "cross_attention_head_dim",
         "cross_attention_dim", "caption_channels", "in_channels", "out_channels", "patch_size", "sample_size",
         "pos_embed_max_size")


def config_problem(model: str, folder: str | Path) -> str | None:
    """Why ``folder``'s transformer/config.json is no config of ``model`` within the bounds (None when it is, or
    when the folder has none: the loader says what is missing)."""
    from solbench.models.flops import REAL_MODELS

    path = Path(folder).expanduser() / "transformer" / "config.json"
    if model not in REAL_MODELS or not path.is_file():
        return None
    data, unreadable = read_config(path)
    if unreadable:
        return unreadable
    if not isinstance(data, dict):
        return f"{path}: a transformer config is a JSON object, got {type(data).__name__}"
    published = REAL_MODELS[model].config
    problems = []
    for key in SIZES:
        if key not in published or key not in data:
            continue
        value, bound = data[key], GROWTH * published[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= bound:
            problems.append(f"{key} {clip(value, 40)} (a whole number from 1 to {bound:,}, {GROWTH} x the "
                            f"published {published[key]:,})")
    if not problems:
        return None
    depth = sum(data.get(k, published[k]) if isinstance(data.get(k), int) else published[k]
                for k in ("num_layers", "num_single_layers") if k in published)
    depth_ratio = depth / sum(published[k] for k in ("num_layers", "num_single_layers") if k in published)
    width_ratio = 1.0
    for key in ("num_attention_heads", "attention_head_dim"):
        value = data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            width_ratio *= value / published[key]
    parameters = REAL_MODELS[model].parameters() * depth_ratio * width_ratio ** 2
    return (f"{path}: {'; '.join(problems)}: the config would build about {parameters:,.0f} parameters "
            f"(the published {model} transformer has {REAL_MODELS[model].parameters():,})")
