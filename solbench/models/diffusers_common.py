"""What the FLUX, SD3 and SANA adapters share: a diffusers pipeline behind the ModelAdapter interface.

Each real adapter keeps its diffusers pipeline object and reuses the pipeline's own prompt encoding
(``encode_prompt``) and latent packing, so conditioning and latents are exactly what the pipeline
would feed its transformer; only the denoising loop is solbench's (solbench.sampling). Weights load
with ``local_files_only=True``: a model missing from the local path or the Hugging Face cache fails at
once with MissingWeightsError naming the model id and how to download it.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from solbench.errors import MissingWeightsError
from solbench.models.base import ModelAdapter


def load_pipeline(pipeline_cls, path: str, default_id: str, dtype: torch.dtype, gated: bool):
    """``pipeline_cls.from_pretrained(path, local_files_only=True)`` or a MissingWeightsError."""
    try:
        return pipeline_cls.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError, EnvironmentError) as err:
        gate = (f" {default_id} is a gated model: accept its licence on https://huggingface.co/{default_id} "
                f"and log in (`huggingface-cli login`) first." if gated else "")
        raise MissingWeightsError(
            f"cannot load {pipeline_cls.__name__} weights from {path!r} (local folder or Hugging Face cache; "
            f"nothing is downloaded at run time). Get them with `huggingface-cli download {path if '/' in path and not path.startswith(('/', '.')) else default_id}` "
            f"(or set model.path to a local copy).{gate} Loader said: {type(err).__name__}: {str(err).splitlines()[0][:300]}"
        ) from err


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
        frozen_device = torch.device("cpu") if cpu_offload else self.device
        for module in self._frozen_modules():
            module.to(frozen_device, full_dtype).requires_grad_(False).eval()

    def _frozen_modules(self) -> list[nn.Module]:
        names = ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")
        return [m for m in (getattr(self.pipe, n, None) for n in names) if isinstance(m, nn.Module)]

    @contextlib.contextmanager
    def _loaded(self, *modules: nn.Module):
        """With cpu_offload, move frozen modules to the device only while they run."""
        if self.cpu_offload:
            for m in modules:
                m.to(self.device)
        try:
            yield
        finally:
            if self.cpu_offload:
                for m in modules:
                    m.to("cpu")
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()

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
