"""What the FLUX, SD3 and SANA adapters share: a diffusers pipeline behind the ModelAdapter interface.

Each real adapter keeps its diffusers pipeline object and reuses the pipeline's own prompt encoding
(``encode_prompt``) and latent packing, so conditioning and latents are exactly what the pipeline
would feed its transformer; only the denoising loop is solbench's (solbench.engine.sampling). Weights load
with ``local_files_only=True``: a model missing from the local path or the Hugging Face cache fails at
once with MissingWeightsError naming the model id and how to download it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import Tensor, nn

from solbench.errors import ConfigError, MissingWeightsError
from solbench.models.base import ModelAdapter


def _dtype_kwarg() -> str:
    """``dtype`` where diffusers has it (it warns that ``torch_dtype`` is deprecated), else ``torch_dtype``."""
    try:
        from diffusers.utils import deprecation_utils
    except ImportError:
        return "torch_dtype"
    return "dtype" if hasattr(deprecation_utils, "_resolve_dtype") else "torch_dtype"


_DTYPE_KWARG = _dtype_kwarg()


def load_pipeline(pipeline_cls, path: str, default_id: str, dtype: torch.dtype, gated: bool, **components):
    """``pipeline_cls.from_pretrained(path, local_files_only=True)`` or a MissingWeightsError.

    ``components`` replace pipeline parts (``transformer=None``: not loaded, the caller supplies one). A local
    folder's transformer config is checked against the published one first (solbench.models.real_bounds).
    """
    from solbench.models.real_bounds import config_problem

    from solbench.models import cards

    model = next((name for name, c in cards().items() if c.pipeline == pipeline_cls.__name__), None)
    problem = config_problem(model, path) if model and Path(path).expanduser().is_dir() else None
    if problem:
        raise ConfigError(f"model.path {path!r}: {problem}")
    try:
        return pipeline_cls.from_pretrained(path, **{_DTYPE_KWARG: dtype}, local_files_only=True, **components)
    except (OSError, ValueError, EnvironmentError) as err:
        from solbench.models.hub import model_download_command

        repo = path if "/" in path and not path.startswith(("/", ".")) else default_id
        gate = (f" {default_id} is a gated model: accept its licence on https://huggingface.co/{default_id} "
                f"and log in (`hf auth login`) first." if gated else "")
        command = model_download_command(repo, layout_of=default_id)
        raise MissingWeightsError(
            f"cannot load {pipeline_cls.__name__} weights from {path!r} (local folder or Hugging Face cache; "
            f"nothing is downloaded at run time). Get them with `{command}` "
            f"(or set model.path to a local copy).{gate} Loader said: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
        ) from err


def build_pretrained(adapter_cls, cfg, device: torch.device, dtype: torch.dtype, **extra) -> ModelAdapter:
    """``adapter_cls.from_pretrained`` with a ModelConfig's path, resolution, offload and text length (a model
    card's builder; ``extra``: the model's own settings)."""
    return adapter_cls.from_pretrained(cfg.path, device=device, full_dtype=dtype, resolution=cfg.resolution,
                                       cpu_offload=cfg.cpu_offload, max_sequence_length=cfg.text_max_length, **extra)


def avoid_cudnn_attention() -> None:
    """Take cuDNN out of torch's scaled-dot-product attention backends (flash and memory-efficient stay).

    Measured on an H200 (torch 2.11.0+cu130, docs/measured/H200.md): the backward of FLUX.1's attention at
    training shapes (16 x 4224 tokens, 24 heads of 128, the q/k/v layout diffusers passes) fails in
    cuDNN's fused attention ("mha_graph.execute(...).is_good()" with blocking launches, an illegal memory
    access in a full iteration); the same block trains with cuDNN attention off. The other backends give
    the same attention up to rounding, so this changes no setting of any method.
    """
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


class DiffusersAdapter(ModelAdapter):
    """Common plumbing: devices, dtypes, optional CPU offload of the frozen parts, batched VAE decode."""

    decode_batch = 8  # VAE decodes per call (activation memory at 1024 px)

    def __init__(self, pipe, *, device, full_dtype: torch.dtype, cpu_offload: bool = False) -> None:
        super().__init__()
        self.pipe = pipe
        self.device = torch.device(device)
        self.full_dtype = full_dtype
        self.cpu_offload = cpu_offload
        self.transformer = pipe.transformer.to(self.device, full_dtype)
        self._resident: set[int] = set()  # ids of offloaded modules on the device right now
        avoid_cudnn_attention()  # a process-wide switch of torch's CUDA attention; nothing changes on a CPU
        if self.device.type == "cuda":
            self.cond_cache_device = torch.device("cpu")  # prompt embeddings wait in host memory
        frozen_device = torch.device("cpu") if cpu_offload else self.device
        for module in self._frozen_modules():
            module.to(frozen_device, full_dtype).requires_grad_(False).eval()

    def _frozen_modules(self) -> list[nn.Module]:
        names = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")
        return [m for m in (getattr(self.pipe, n, None) for n in names) if isinstance(m, nn.Module)]

    @contextlib.contextmanager
    def _loaded(self, *modules: nn.Module):
        """With cpu_offload, move frozen modules to the device only while they run.

        Nested uses move only what is not already there, so ``encode`` loads the text encoders once
        for all its new prompts (each still encoded on its own) instead of once per prompt.
        """
        moved = [m for m in modules if self.cpu_offload and id(m) not in self._resident]
        for m in moved:
            m.to(self.device)
            self._resident.add(id(m))
        try:
            yield
        finally:
            for m in moved:
                m.to("cpu")
                self._resident.discard(id(m))
            if moved and self.device.type == "cuda":
                torch.cuda.empty_cache()

    def _text_encoders_resident(self):
        return self._loaded(*self._text_encoders())

    def _text_encoders(self) -> list[nn.Module]:
        return [m for m in self._frozen_modules() if m is not self.pipe.vae]

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        vae = self.pipe.vae
        out = []
        with self._loaded(vae):
            for chunk in latents.split(self.decode_batch):
                out.append(self._decode_chunk(vae, chunk.to(self.device)).float())
        images = torch.cat(out) if out else latents.new_zeros((0, 3, 1, 1))
        return (images / 2 + 0.5).clamp(0, 1)

    def _decode_chunk(self, vae, latents: Tensor) -> Tensor:
        """Decoder output in [-1, 1] for unscaled latents (each model scales/shifts its own way)."""
        scaled = latents / vae.config.scaling_factor + (getattr(vae.config, "shift_factor", None) or 0.0)
        return vae.decode(scaled.to(vae.dtype), return_dict=False)[0]
