"""FLUX.1 adapter (FluxTransformer2DModel + CLIP-L and T5-XXL text encoders + AutoencoderKL).

Latents are kept unpacked, [16, H/8, W/8] per sample (the shape the pipeline draws its noise in), and
packed into 2x2 tokens with the pipeline's ``_pack_latents`` around every transformer call, with its
``latent_image_ids``. FLUX.1-dev is guidance-distilled: the guidance scale is a transformer input
(default 3.5), not classifier-free guidance; FLUX.1-schnell has no guidance input. The sigma shift is
the pipeline's resolution-dependent mu (shift = exp(mu)). Prompts are encoded to 128 T5 tokens by
default (train_flux1.py's TEXT_ENCODER_MAX_SEQ_LEN; model.text_max_length; the pipeline's default is 512).
"""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn

from solbench.models import flops
from solbench.models.base import Cond, net_dtype
from solbench.models.card import ModelCard, ModelWeights, Probe
from solbench.models.diffusers_common import DiffusersAdapter, build_pretrained, load_pipeline
from solbench.models.model_files import CLIP_TOKENIZER, DIFFUSERS_MODEL, SCHEDULER, T5_TOKENIZER, TEXT_MODEL

DEFAULT_ID = "black-forest-labs/FLUX.1-dev"
TEXT_MAX_LENGTH = 128  # T5 tokens: Sol-RL's train_flux1.py and flow_grpo's train_flux.py encode 128


class FluxAdapter(DiffusersAdapter):
    name = "flux"
    max_sequence_length = TEXT_MAX_LENGTH

    def __init__(self, pipe, *, device="cpu", full_dtype=torch.float32, resolution: int | None = None,
                 cpu_offload: bool = False, max_sequence_length: int | None = None) -> None:
        super().__init__(pipe, device=device, full_dtype=full_dtype, cpu_offload=cpu_offload)
        if max_sequence_length is not None:
            self.max_sequence_length = max_sequence_length
        cfg = self.transformer.config
        self.guidance_mode = "distilled" if cfg.guidance_embeds else "none"
        self.default_guidance = 3.5 if cfg.guidance_embeds else None
        self._set_resolution(int(resolution or pipe.default_sample_size * pipe.vae_scale_factor))

    def _set_resolution(self, resolution: int) -> None:
        """Latent shape, image ids and the scheduler's resolution-dependent shift at ``resolution`` px."""
        pipe = self.pipe
        self.resolution = resolution
        side = 2 * (self.resolution // (pipe.vae_scale_factor * 2))
        self.latent_shape = (self.transformer.config.in_channels // 4, side, side)
        sched = pipe.scheduler.config
        if sched.get("use_dynamic_shifting", False):
            from diffusers.pipelines.flux.pipeline_flux import calculate_shift

            mu = calculate_shift((side // 2) ** 2, sched.get("base_image_seq_len", 256),
                                 sched.get("max_image_seq_len", 4096), sched.get("base_shift", 0.5),
                                 sched.get("max_shift", 1.15))
            self.default_shift = math.exp(mu)
        else:
            self.default_shift = sched.get("shift", 1.0)
        self.img_ids = pipe._prepare_latent_image_ids(1, side // 2, side // 2, self.device, torch.float32)

    @classmethod
    def from_components(cls, *, transformer, vae, text_encoder, tokenizer, text_encoder_2, tokenizer_2,
                        scheduler=None, **kwargs) -> "FluxAdapter":
        from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline

        pipe = FluxPipeline(scheduler=scheduler or FlowMatchEulerDiscreteScheduler(), vae=vae,
                            text_encoder=text_encoder, tokenizer=tokenizer, text_encoder_2=text_encoder_2,
                            tokenizer_2=tokenizer_2, transformer=transformer)
        return cls(pipe, **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, device="cpu", full_dtype=torch.float32,
                        **kwargs) -> "FluxAdapter":
        from diffusers import FluxPipeline

        pipe = load_pipeline(FluxPipeline, path or DEFAULT_ID, DEFAULT_ID, full_dtype, gated=True)
        return cls(pipe, device=device, full_dtype=full_dtype, **kwargs)

    def _encode_batch(self, prompts: list[str]) -> Cond:
        with self._loaded(*self._text_encoders()):
            embeds, pooled, _ = self.pipe.encode_prompt(prompt=prompts, prompt_2=None, device=self.device,
                                                        max_sequence_length=self.max_sequence_length)
        return Cond({"prompt_embeds": embeds.float(), "pooled_prompt_embeds": pooled.float()})

    def _forward(self, net: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None) -> Tensor:
        dtype = net_dtype(net)
        b, c, h, w = x_t.shape
        embeds = cond["prompt_embeds"].to(dtype)
        g = None
        if self.transformer.config.guidance_embeds:
            g = torch.full((b,), 3.5 if guidance is None else float(guidance), device=x_t.device, dtype=torch.float32)
        out = net(
            hidden_states=self.pipe._pack_latents(x_t.to(dtype), b, c, h, w),
            timestep=t.float(),  # sigma; the transformer casts it to its dtype and scales by 1000 itself
            guidance=g,
            pooled_projections=cond["pooled_prompt_embeds"].to(dtype),
            encoder_hidden_states=embeds,
            txt_ids=torch.zeros(embeds.shape[1], 3, device=x_t.device, dtype=dtype),
            img_ids=self.img_ids.to(dtype),
            return_dict=False,
        )[0]
        return self.pipe._unpack_latents(out, h * self.pipe.vae_scale_factor, w * self.pipe.vae_scale_factor,
                                         self.pipe.vae_scale_factor).float()

    def flops_per_forward(self) -> float | None:
        _, h, w = self.latent_shape
        return flops.flux_forward_flops(dict(self.transformer.config), image_tokens=(h // 2) * (w // 2),
                                        text_tokens=self.max_sequence_length)


CARD = ModelCard(
    name="flux", order=1, build=functools.partial(build_pretrained, FluxAdapter), adapter=FluxAdapter,
    pipeline="FluxPipeline", explore_recipe="nvfp4_flux", lora_init="gaussian",
    micro_batch={"rollout": 8, "reward": 32, "train": 4}, native_resolution=1024,
    text_max_length=TEXT_MAX_LENGTH, settings=("text_max_length",),
    # 19 double + 38 single blocks of width 3072, 512 T5 tokens joined to the image tokens, VAE /8 and 2x2
    # patches, guidance distilled (one forward). LoRA on to_q/k/v/to_out.0: 19 x 4 + 38 x 3 layers of
    # 3072 -> 3072, r (in + out) each.
    weights=ModelWeights("flux", "FLUX.1-dev", DEFAULT_ID, True,
                         "FLUX.1 [dev] Non-Commercial License (accept on the model page)", 11.9, 4.9,
                         blocks=57, hidden=3072, text_tokens=512, pixels_per_token=16, cfg=False,
                         lora_params_per_rank_m=190 * 6144 / 1e6, vae_decode_gb_1024=1.6),
    # FluxPipeline: CLIP-L (text_encoder) and T5-XXL (text_encoder_2)
    files={"transformer": DIFFUSERS_MODEL, "vae": DIFFUSERS_MODEL, "text_encoder": TEXT_MODEL,
           "text_encoder_2": TEXT_MODEL, "tokenizer": CLIP_TOKENIZER, "tokenizer_2": T5_TOKENIZER,
           "scheduler": SCHEDULER},
    transformer=flops.RealModelSpec(
        hub_id=DEFAULT_ID,
        class_name="FluxTransformer2DModel",
        config=dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
                    num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                    guidance_embeds=True, axes_dims_rope=[16, 56, 56]),
        resolution=1024, vae_factor=8, text_tokens=512, pack=2,
    ),
    vae="kl16",
    # 2 heads x 128 (rotary axes 16 + 56 + 56 kept); T5 / pooled CLIP inputs narrowed with the width
    probe=Probe({"num_attention_heads": 2, "num_layers": 2, "num_single_layers": 2, "joint_attention_dim": 64,
                 "pooled_projection_dim": 64}, 256, {16: 8, 64: 16},
                block_count=lambda kind, config: config["num_single_layers"] if kind.startswith("FluxSingle")
                else config["num_layers"]),
)
