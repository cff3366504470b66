"""The model adapter interface: everything the harness needs from a text-to-image flow model.

Samplers, the engine and the RL methods never see an architecture. They see a ``ModelAdapter``:
prompt conditioning (``Cond``, cached per prompt text), a velocity prediction at (x_t, t, prompt)
for any network given explicitly (policy, explore copy, old policy, EMA, reference), the per-sample
latent shape, the sigma schedule with the model's shift, and a decoder to images in [0, 1].

Conventions (docs/architecture.md): flow-matching time t in [0, 1], t=1 pure noise, t=0 data,
x_t = (1 - t) x0 + t eps, velocity v ~ eps - x0. Latents and velocities cross this interface in
float32; each adapter casts to the network's own dtype inside ``velocity`` and back, so the same
sampler code drives a bf16 policy, an fp32 CPU policy and a fake-quantized copy.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from solbench.errors import ConfigError

#: How an adapter applies its guidance scale: classifier-free guidance against the empty prompt,
#: a distilled guidance input of the transformer (FLUX.1-dev), or none.
GUIDANCE_MODES = ("cfg", "distilled", "none")


@dataclass(frozen=True)
class Cond:
    """Prompt conditioning for a batch: named tensors that all share the batch dimension 0.

    Adapters choose the names (``tokens``/``pooled`` for the tiny model, ``prompt_embeds``/
    ``pooled_prompt_embeds`` for FLUX and SD3, ``prompt_embeds``/``attention_mask`` for SANA).
    """

    tensors: dict[str, Tensor]

    def __post_init__(self) -> None:
        sizes = {name: t.shape[0] for name, t in self.tensors.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Cond tensors disagree on batch size: {sizes}")

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).shape[0] if self.tensors else 0

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]

    def index(self, idx: Tensor | Sequence[int] | slice) -> "Cond":
        """The sub-batch at ``idx`` (indices, a bool mask or a slice)."""
        if isinstance(idx, slice):
            return Cond({name: t[idx] for name, t in self.tensors.items()})
        idx = torch.as_tensor(idx)
        if idx.dtype != torch.bool:
            idx = idx.long()
        return Cond({name: t[idx.to(t.device)] for name, t in self.tensors.items()})

    def repeat(self, n: int) -> "Cond":
        """Each row repeated n times in place (row i becomes rows i*n .. i*n+n-1)."""
        return Cond({name: t.repeat_interleave(n, dim=0) for name, t in self.tensors.items()})

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> "Cond":
        """Move to ``device``; cast floating tensors (never masks or ids) to ``dtype``."""
        return Cond({
            name: t.to(device=device, dtype=dtype if (dtype is not None and t.is_floating_point()) else t.dtype)
            for name, t in self.tensors.items()
        })

    @classmethod
    def cat(cls, conds: Iterable["Cond"]) -> "Cond":
        conds = list(conds)
        if not conds:
            raise ValueError("Cond.cat needs at least one Cond")
        names = list(conds[0].tensors)
        for c in conds[1:]:
            if list(c.tensors) != names:
                raise ValueError(f"Cond.cat: tensor names differ ({names} vs {list(c.tensors)})")
        return cls({name: torch.cat([c.tensors[name] for c in conds]) for name in names})


def shifted_sigmas(steps: int, shift: float | None = None) -> Tensor:
    """The linear sigma schedule 1 -> 0 in ``steps`` steps with SD3/FLUX's time shift.

    sigma' = shift * s / (1 + (shift - 1) * s). FLUX's resolution-dependent ("dynamic") shift with
    mu is the same map with shift = exp(mu) (diffusers' exponential time shift), so every adapter
    uses this one function. Returns float32 [steps + 1], sigmas[0] = 1 and sigmas[-1] = 0.
    """
    if steps < 1:
        raise ConfigError(f"sampling steps must be >= 1, got {steps}")
    s = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    if shift is not None and shift != 1.0:
        if shift <= 0:
            raise ConfigError(f"sigma-schedule shift must be > 0, got {shift}")
        s = shift * s / (1 + (shift - 1) * s)
    return s.to(torch.float32)


def net_dtype(net: nn.Module) -> torch.dtype:
    """The compute dtype of a network: the dtype of its first floating-point parameter."""
    for p in net.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


class ModelAdapter(ABC):
    """A text-to-image flow model seen through the harness's conventions.

    Subclasses set the attributes below in ``__init__`` and implement ``_encode_batch``,
    ``_forward`` and ``decode``. ``velocity`` applies guidance on top of ``_forward``.
    """

    name: str
    transformer: nn.Module  # the policy denoiser; LoRA attaches here
    full_dtype: torch.dtype
    device: torch.device
    latent_shape: tuple[int, ...]  # per sample, as the sampler sees it
    default_shift: float | None = None
    default_guidance: float | None = None
    guidance_mode: str = "cfg"
    uncond_prompt: str = ""  # CFG's unconditional prompt

    # Prompt-embedding cache: least recently used texts are evicted beyond ``cond_cache_size``
    # entries (re-encoding gives the same numbers: each text is encoded on its own), and with
    # ``cond_cache_device`` set the cache lives there (real adapters on CUDA keep it in host memory;
    # a FLUX prompt is ~8 MB of float32, so an unbounded GPU cache grew by GBs per run).
    cond_cache_size: int = 1024
    cond_cache_device: torch.device | None = None

    def __init__(self) -> None:
        self._cond_cache: OrderedDict[str, Cond] = OrderedDict()

    # -- conditioning ----------------------------------------------------------------------
    def encode(self, prompts: Sequence[str]) -> Cond:
        """Conditioning for ``prompts``; each distinct text is encoded once and cached (LRU).

        A text is encoded on its own, never batched with others: its embedding then does not depend
        on which prompts happened to be new at the same time (GEMMs are not row-invariant across
        batch sizes), so every rank and every run order conditions on the same numbers.
        """
        prompts = list(prompts)
        new = [p for p in dict.fromkeys(prompts) if p not in self._cond_cache]
        found: dict[str, Cond] = {}
        if new:
            with torch.no_grad(), self._text_encoders_resident():
                for text in new:
                    found[text] = self._encode_batch([text])
        for text in dict.fromkeys(prompts):
            if text in self._cond_cache:
                self._cond_cache.move_to_end(text)
                found.setdefault(text, self._cond_cache[text])
        for text in new:
            cached = found[text] if self.cond_cache_device is None else found[text].to(self.cond_cache_device)
            self._cond_cache[text] = found[text] = cached  # one device for all rows before the cat
        while len(self._cond_cache) > max(self.cond_cache_size, 0):
            self._cond_cache.popitem(last=False)
        out = Cond.cat(found[p] for p in prompts)
        return out if self.cond_cache_device is None else out.to(self.device)

    def _text_encoders_resident(self):
        """Context in which a batch of new prompts is encoded (CPU offload loads the encoders once)."""
        return contextlib.nullcontext()

    def uncond_cond(self) -> Cond:
        """Conditioning of CFG's unconditional branch (one row): the empty prompt, cached."""
        return self.encode([self.uncond_prompt])

    def clear_cache(self) -> None:
        self._cond_cache.clear()

    @abstractmethod
    def _encode_batch(self, prompts: list[str]) -> Cond:
        """Encode distinct prompts (no caching here), tensors on self.device, floats in float32."""

    # -- denoiser -----------------------------------------------------------------------------
    def velocity(self, net: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None = None,
                 detach_uncond: bool = False) -> Tensor:
        """Predicted velocity (float32, shape of x_t) of ``net`` at (x_t, t) for ``cond``.

        t is [B] (or a scalar) in [0, 1]. ``guidance`` None means the adapter's default; for CFG
        models a scale of None or 1 is a single conditional forward, otherwise
        v = v_uncond + g (v_cond - v_uncond) with the empty prompt as the unconditional one.
        ``detach_uncond`` stops the gradient through v_uncond (the same value; the gradient is
        g grad v_cond), as flow_grpo's compute_log_prob does under CFG.
        """
        if guidance is None:
            guidance = self.default_guidance
        t = torch.as_tensor(t, dtype=torch.float32, device=x_t.device)
        if t.ndim == 0:
            t = t.expand(x_t.shape[0])
        if self.guidance_mode == "cfg" and guidance is not None and guidance != 1.0:
            uncond = self.uncond_cond().repeat(x_t.shape[0])
            both = self._forward(net, torch.cat([x_t, x_t]), torch.cat([t, t]), Cond.cat([uncond, cond]), None)
            v_uncond, v_cond = both.chunk(2)
            if detach_uncond:
                v_uncond = v_uncond.detach()
            return v_uncond + guidance * (v_cond - v_uncond)
        return self._forward(net, x_t, t, cond, guidance if self.guidance_mode == "distilled" else None)

    @abstractmethod
    def _forward(self, net: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None) -> Tensor:
        """One forward pass of ``net``: float32 x_t [B, *latent_shape], t [B] -> float32 velocity."""

    def forwards_per_velocity(self, guidance: float | None = None) -> int:
        """Network forwards one ``velocity`` call costs per sample (2 under CFG)."""
        g = self.default_guidance if guidance is None else guidance
        return 2 if (self.guidance_mode == "cfg" and g is not None and g != 1.0) else 1

    def flops_per_forward(self) -> float | None:
        """FLOPs of one network forward for one sample (solbench.models.flops), None where unknown."""
        return None

    # -- resolution -------------------------------------------------------------------------------
    resolution: int | None = None  # image side in pixels that samples are drawn at
    # what depends on the resolution: an adapter's _set_resolution sets these, at_resolution restores them
    RESOLUTION_STATE = ("resolution", "latent_shape", "default_shift", "img_ids")

    def _set_resolution(self, resolution: int) -> None:
        """Make the adapter sample ``resolution`` px images (latent shape and whatever else depends on it)."""
        raise ConfigError(f"eval.resolution: the {self.name} model samples only at its own {self.resolution} px, "
                          f"not {resolution} px; leave eval.resolution unset (null)")

    @contextlib.contextmanager
    def at_resolution(self, resolution: int | None):
        """Inside the block the adapter samples ``resolution`` px images (an evaluation protocol's,
        eval.resolution, for a run trained at another); None or its own resolution changes nothing."""
        if resolution is None or resolution == self.resolution:
            yield self
            return
        if not isinstance(resolution, int) or resolution < 1:
            raise ConfigError(f"eval.resolution must be a positive number of pixels or null, got {resolution!r}")
        saved = {name: vars(self)[name] for name in self.RESOLUTION_STATE if name in vars(self)}
        self._set_resolution(resolution)
        try:
            yield self
        finally:
            for name in self.RESOLUTION_STATE:
                vars(self).pop(name, None)
            vars(self).update(saved)

    # -- schedule and decoding -------------------------------------------------------------------
    def sigmas(self, steps: int, shift: float | None = None) -> Tensor:
        """Float32 [steps + 1] schedule from 1 to 0 with ``shift`` (None = the model's default)."""
        return shifted_sigmas(steps, self.default_shift if shift is None else shift)

    @abstractmethod
    def decode(self, latents: Tensor) -> Tensor:
        """Images float32 [B, 3, H, W] in [0, 1] from latents [B, *latent_shape]."""

    def latent_numel(self) -> int:
        return math.prod(self.latent_shape)
