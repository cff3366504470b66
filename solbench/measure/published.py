"""The real models and reward models at their published shapes, with random weights, no download.

``build_adapter("flux", device)`` gives a FluxAdapter whose transformer, VAE and text encoders are the
real diffusers/transformers classes built from solbench/models/published/<model>.json (their
published config.json files), on ``device`` in the run's dtype, with random weights; the rewards
(``build_rewards``) likewise from published/rewards.json in fp32. Nothing is read from the Hugging
Face cache: this is what `solbench doctor SPEC --measure` runs one iteration of, to measure time and
memory on a GPU that has no weights. ``tiny=True`` builds the same classes at the small sizes the
JSON's "tiny" section gives (the CPU tests run the same code path).

What differs from the real thing: the weights (random, small normal init so activations stay
finite: the numbers are meaningless, the shapes and costs are not) and the tokenizers (character-level
vocabularies with the published maximum lengths: the transformer sees the real token counts;
SANA's Gemma encodes its long instruction prefix in more tokens than the real tokenizer makes,
once per prompt, before keeping the last 300).
"""

from __future__ import annotations

import json
import string
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from solbench.models.base import ModelAdapter

__all__ = ["PUBLISHED", "build_adapter", "build_rewards", "published_config"]

PUBLISHED = Path(__file__).resolve().parents[1] / "models" / "published"
_LETTERS = list(string.ascii_lowercase + string.digits)


def published_config(name: str) -> dict:
    """The JSON of solbench/models/published/<name>.json."""
    return json.loads((PUBLISHED / f"{name}.json").read_text())


@contextmanager
def _building(device: torch.device, dtype: torch.dtype):
    """Create modules directly on ``device`` in ``dtype`` (no full-size host copy, no fp32 detour)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def _small_init(module: nn.Module, std: float = 0.02) -> nn.Module:
    """Normal(0, std) weights and zero biases for every Linear and convolution: random weights whose
    activations stay finite through 57 blocks (the quantizer refuses NaN/inf)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Embedding)):
            m.weight.normal_(0.0, std)
            if getattr(m, "bias", None) is not None:
                m.bias.zero_()
    return module


def _component(spec: dict, overrides: dict | None) -> nn.Module | object:
    library, cls_name = spec["library"], spec["class"]
    config = {**spec.get("config", {}), **(overrides or {})}
    if library == "diffusers":
        import diffusers

        return _small_init(getattr(diffusers, cls_name).from_config(config)).eval()
    import transformers

    cfg = getattr(transformers, spec["config_class"])(**config)
    return getattr(transformers, cls_name)(cfg).eval()


def _tokenizer(spec: dict, overrides: dict | None):
    """A character-level tokenizer of the published class with the published maximum length."""
    import transformers

    cls_name = spec["class"]
    max_length = int({**spec, **(overrides or {})}.get("model_max_length", 512))
    cls = getattr(transformers, cls_name)
    if cls_name == "CLIPTokenizer":
        vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "!": 2}
        for c in _LETTERS:
            vocab.setdefault(c, len(vocab))
            vocab.setdefault(c + "</w>", len(vocab))
        return cls(vocab=vocab, merges=[], model_max_length=max_length)
    if cls_name == "T5Tokenizer":
        return cls(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -1.0)] + [(c, -2.0) for c in _LETTERS],
                   model_max_length=max_length)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(_LETTERS + ["\u2581"])}}
    return cls(vocab=vocab, merges=[], model_max_length=max_length)


def build_adapter(model: str, device: torch.device | str, dtype: torch.dtype = torch.bfloat16, *,
                  tiny: bool = False, resolution: int | None = None, cpu_offload: bool = False) -> ModelAdapter:
    """The model's adapter (solbench.models) over its published-shape pipeline with random weights.

    The transformer is built on ``device``; the frozen parts on the host when ``cpu_offload``.
    """
    device = torch.device(device)
    spec = published_config(model)
    tiny_overrides = spec.get("tiny", {}) if tiny else {}
    parts = {}
    torch.manual_seed(0)
    for name, component in spec["components"].items():
        overrides = tiny_overrides.get(name)
        if name.startswith("tokenizer"):
            parts[name] = _tokenizer(component, overrides)
        elif name == "scheduler":
            import diffusers

            parts[name] = getattr(diffusers, component["class"]).from_config(component["config"])
        else:
            where = torch.device("cpu") if cpu_offload and name != "transformer" else device
            with _building(where, dtype):
                parts[name] = _component(component, overrides)
    kwargs = dict(device=device, full_dtype=dtype, cpu_offload=cpu_offload,
                  resolution=resolution or (tiny_overrides.get("resolution") if tiny else None))
    if tiny and "max_sequence_length" in tiny_overrides:
        kwargs["max_sequence_length"] = tiny_overrides["max_sequence_length"]
    from solbench.models import card

    return card(model).adapter.from_components(**parts, **kwargs)  # the model card's adapter class


def build_rewards(names, device: torch.device | str, *, tiny: bool = False) -> dict:
    """The named reward models (solbench.rewards.real classes) with published-shape random weights, fp32.

    Rewards without weights (the embedded ones) come from the registry as usual."""
    from solbench import rewards as registry
    from solbench.rewards import real

    spec = published_config("rewards")
    device = torch.device(device)
    out = {}
    for name in names:
        kind = spec["rewards"].get(name)
        if kind is None:
            out[name] = registry.get(name, device)
            continue
        torch.manual_seed(0)
        with _building(device, torch.float32):
            if kind == "blip":
                from transformers import BertTokenizer

                vision = real.imagereward_vision_config(**(spec["tiny"]["blip_vision"] if tiny else {}))
                text = real.imagereward_text_config(None, encoder_hidden_size=vision.hidden_size,
                                                    **(spec["tiny"]["blip_text"] if tiny else {}))
                model = real.ImageRewardModel(vision, text).eval()
                vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                                    + _LETTERS + [f"##{c}" for c in _LETTERS])}
                tokenizer = real.add_blip_special_tokens(BertTokenizer(vocab=vocab))
                out[name] = real.ImageRewardReward(model=model, tokenizer=tokenizer, device=device)
            else:
                from transformers import CLIPConfig, CLIPModel

                config = spec["tiny"]["clip"] if tiny else spec[kind]
                model = CLIPModel(CLIPConfig(**config)).eval()
                tokenizer = _tokenizer({"class": "CLIPTokenizer", "model_max_length": 77}, None)
                out[name] = real.REAL_REWARDS[name](model=model, tokenizer=tokenizer, device=device)
    return out
