"""SD3 / SD3.5 adapter (SD3Transformer2DModel + CLIP-L, CLIP-G and T5-XXL text encoders + AutoencoderKL).

Latents [16, H/8, W/8]; the transformer takes the timestep in the pipeline's 0..1000 scale, in float32
as the pipeline and Sol-RL's train_sd3.py pass it (the time embedding casts after its sinusoids; a bf16
timestep would move by up to 2 between 512 and 1000). Prompts are encoded to 128 T5 tokens by default
(train_sd3.py's TEXT_ENCODER_MAX_SEQ_LEN; model.text_max_length).
Classifier-free guidance against the empty prompt (encoded by the same pipeline code, as the
pipeline encodes its default negative prompt); the sigma shift is the scheduler's static shift
(3.0 for SD3.5).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from solbench.models import flops
from solbench.models.base import Cond, net_dtype
from solbench.models.card import ModelCard, ModelWeights, Probe
from solbench.models.diffusers_common import DiffusersAdapter, build_pretrained, load_pipeline
from solbench.models.model_files import CLIP_TOKENIZER, DIFFUSERS_MODEL, SCHEDULER, T5_TOKENIZER, TEXT_MODEL

DEFAULT_ID = "stabilityai/stable-diffusion-3.5-large"
TEXT_MAX_LENGTH = 128  # T5 tokens: Sol-RL's train_sd3.py and flow_grpo's train_sd3.py encode 128


class SD3Adapter(DiffusersAdapter):
    name = "sd3"
    guidance_mode = "cfg"
    default_guidance = 4.5  # FlowGRPO's SD3.5 rollout CFG
    max_sequence_length = TEXT_MAX_LENGTH

    def __init__(self, pipe, *, device="cpu", full_dtype=torch.float32, resolution: int | None = None,
                 cpu_offload: bool = False, max_sequence_length: int | None = None) -> None:
        super().__init__(pipe, device=device, full_dtype=full_dtype, cpu_offload=cpu_offload)
        if max_sequence_length is not None:
            self.max_sequence_length = max_sequence_length
        self._set_resolution(int(resolution or pipe.default_sample_size * pipe.vae_scale_factor))
        self.default_shift = pipe.scheduler.config.get("shift", 1.0)

    def _set_resolution(self, resolution: int) -> None:
        self.resolution = resolution
        side = self.resolution // self.pipe.vae_scale_factor
        self.latent_shape = (self.transformer.config.in_channels, side, side)

    @classmethod
    def from_components(cls, *, transformer, vae, text_encoder, tokenizer, text_encoder_2, tokenizer_2,
                        text_encoder_3=None, tokenizer_3=None, scheduler=None, **kwargs) -> "SD3Adapter":
        from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

        pipe = StableDiffusion3Pipeline(
            scheduler=scheduler or FlowMatchEulerDiscreteScheduler(shift=3.0), vae=vae, text_encoder=text_encoder,
            tokenizer=tokenizer, text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2,
            text_encoder_3=text_encoder_3, tokenizer_3=tokenizer_3, transformer=transformer)
        return cls(pipe, **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, device="cpu", full_dtype=torch.float32,
                        **kwargs) -> "SD3Adapter":
        from diffusers import StableDiffusion3Pipeline

        pipe = load_pipeline(StableDiffusion3Pipeline, path or DEFAULT_ID, DEFAULT_ID, full_dtype, gated=True)
        return cls(pipe, device=device, full_dtype=full_dtype, **kwargs)

    def _encode_batch(self, prompts: list[str]) -> Cond:
        with self._loaded(*self._text_encoders()):
            embeds, _, pooled, _ = self.pipe.encode_prompt(
                prompt=prompts, prompt_2=None, prompt_3=None, device=self.device, do_classifier_free_guidance=False,
                max_sequence_length=self.max_sequence_length)
        return Cond({"prompt_embeds": embeds.float(), "pooled_prompt_embeds": pooled.float()})

    def _forward(self, net: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None) -> Tensor:
        dtype = net_dtype(net)
        return net(
            hidden_states=x_t.to(dtype),
            timestep=t.float() * 1000,  # fp32, as the pipeline passes it (bf16 spacing is 4 near 1000)
            encoder_hidden_states=cond["prompt_embeds"].to(dtype),
            pooled_projections=cond["pooled_prompt_embeds"].to(dtype),
            return_dict=False,
        )[0].float()

    def flops_per_forward(self) -> float | None:
        _, h, w = self.latent_shape
        text_tokens = self.encode([self.uncond_prompt])["prompt_embeds"].shape[1]
        return flops.sd3_forward_flops(dict(self.transformer.config), latent_hw=(h, w), text_tokens=text_tokens)


CARD = ModelCard(
    name="sd3", order=2, build=functools.partial(build_pretrained, SD3Adapter), adapter=SD3Adapter,
    pipeline="StableDiffusion3Pipeline", explore_recipe="nvfp4_sd3", lora_init="gaussian",
    micro_batch={"rollout": 8, "reward": 32, "train": 4}, native_resolution=1024,
    text_max_length=TEXT_MAX_LENGTH, text_prefix_tokens=77,  # the prompt embeddings put CLIP-L/G's 77 before T5's
    settings=("text_max_length",),
    # SD3.5-Large: 38 joint blocks of 2432, 77 CLIP + 256 T5 tokens, CFG; LoRA on 38 x 4 layers.
    weights=ModelWeights("sd3", "SD3.5-Large", DEFAULT_ID, True,
                         "Stability AI Community License (accept on the model page)", 8.1, 5.6,
                         blocks=38, hidden=2432, text_tokens=333, pixels_per_token=16, cfg=True,
                         lora_params_per_rank_m=152 * 4864 / 1e6, vae_decode_gb_1024=1.6),
    # StableDiffusion3Pipeline: CLIP-L, CLIP-G (text_encoder_2) and T5-XXL (text_encoder_3)
    files={"transformer": DIFFUSERS_MODEL, "vae": DIFFUSERS_MODEL, "text_encoder": TEXT_MODEL,
           "text_encoder_2": TEXT_MODEL, "text_encoder_3": TEXT_MODEL, "tokenizer": CLIP_TOKENIZER,
           "tokenizer_2": CLIP_TOKENIZER, "tokenizer_3": T5_TOKENIZER, "scheduler": SCHEDULER},
    transformer=flops.RealModelSpec(
        hub_id=DEFAULT_ID,
        class_name="SD3Transformer2DModel",
        config=dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                    num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                    pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm"),
        resolution=1024, vae_factor=8, text_tokens=77 + 256,  # CLIP-L/G tokens + T5 tokens
    ),
    vae="kl16",
    # 4 heads x 64; three blocks: two joint ones and the last, context-pre-only one (SD3.5-Large's 38th)
    probe=Probe({"num_attention_heads": 4, "num_layers": 3, "caption_projection_dim": 256, "joint_attention_dim": 64,
                 "pooled_projection_dim": 64, "pos_embed_max_size": 32}, 256, {16: 8, 64: 16},
                block_count=lambda kind, config: 1 if kind.endswith("(context_pre_only)") else config["num_layers"] - 1,
                last_block_suffix="(context_pre_only)"),
)
