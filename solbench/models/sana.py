"""SANA adapter (SanaTransformer2DModel + Gemma-2 text encoder + AutoencoderDC, the 32x DC-AE).

Prompts are encoded as Sol-RL's train_sana.py encodes them, with ``SanaPipeline.encode_prompt`` and its
default ``complex_human_instruction=None``: the prompt alone, 300 Gemma tokens with the attention
mask. ``prompt_instruction=True`` prepends the pipeline's complex human instruction instead (the
default of ``SanaPipeline.__call__``, read from its signature), keeping token 0 and the last
``max_sequence_length - 1`` tokens. The unconditional branch of CFG is the empty prompt encoded
without any instruction, as the pipeline (and train_sana.py) encode the negative prompt. The
transformer takes the timestep in the 0..1000 scale times its ``timestep_scale``, in float32 (the
native model of the reference divides sigma by its timestep_norm_scale_factor 0.001 in float32).

``checkpoint`` loads the transformer from a native checkpoint instead of the pipeline folder: the
linear-FFN SANA 1.6B that Sol-RL trains (solbench.models.sana_linear), built from the pipeline's
transformer config; its text encoder and VAE are the pipeline's (Sana_1600M_1024px_BF16_diffusers in
the reference).
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor, nn

from solbench.models import flops
from solbench.models.base import Cond, net_dtype
from solbench.models.card import ModelCard, ModelWeights, Probe
from solbench.models.diffusers_common import DiffusersAdapter, build_pretrained, load_pipeline
from solbench.models.model_files import DIFFUSERS_MODEL, GEMMA_TOKENIZER, SCHEDULER, TEXT_MODEL
from solbench.models.sana_linear import DEFAULT_PIPELINE

DEFAULT_ID = "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers"


def _transformer_config(path: str) -> dict:
    """The diffusers transformer config of a pipeline folder or cached repository (never downloads)."""
    from diffusers import SanaTransformer2DModel

    return dict(SanaTransformer2DModel.load_config(path, subfolder="transformer", local_files_only=True))


def _pipeline_default_instruction():
    from diffusers import SanaPipeline

    return inspect.signature(SanaPipeline.__call__).parameters["complex_human_instruction"].default


class SanaAdapter(DiffusersAdapter):
    name = "sana"
    guidance_mode = "cfg"
    default_guidance = 4.5  # SanaPipeline's default CFG
    max_sequence_length = 300

    def __init__(self, pipe, *, device="cpu", full_dtype=torch.float32, resolution: int | None = None,
                 cpu_offload: bool = False, max_sequence_length: int | None = None,
                 prompt_instruction: bool = False) -> None:
        super().__init__(pipe, device=device, full_dtype=full_dtype, cpu_offload=cpu_offload)
        if max_sequence_length is not None:
            self.max_sequence_length = max_sequence_length
        self.complex_human_instruction = _pipeline_default_instruction() if prompt_instruction else None
        self._set_resolution(int(resolution or self.transformer.config.sample_size * pipe.vae_scale_factor))
        sched = pipe.scheduler.config
        self.default_shift = sched.get("flow_shift", None) or sched.get("shift", 1.0)
        self._uncond: Cond | None = None

    def _set_resolution(self, resolution: int) -> None:
        self.resolution = resolution
        side = self.resolution // self.pipe.vae_scale_factor
        self.latent_shape = (self.transformer.config.in_channels, side, side)

    @classmethod
    def from_components(cls, *, transformer, vae, text_encoder, tokenizer, scheduler=None, **kwargs) -> "SanaAdapter":
        from diffusers import FlowMatchEulerDiscreteScheduler, SanaPipeline

        pipe = SanaPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=vae, transformer=transformer,
                            scheduler=scheduler or FlowMatchEulerDiscreteScheduler(shift=3.0))
        return cls(pipe, **kwargs)

    @classmethod
    def from_pretrained(cls, path: str | None = None, *, device="cpu", full_dtype=torch.float32,
                        checkpoint: str | None = None, **kwargs) -> "SanaAdapter":
        from diffusers import SanaPipeline

        if checkpoint is None:
            pipe = load_pipeline(SanaPipeline, path or DEFAULT_ID, DEFAULT_ID, full_dtype, gated=False)
        else:
            from solbench.models.sana_linear import DEFAULT_PIPELINE, load_linear_ffn_transformer, resolve_checkpoint

            path = path or DEFAULT_PIPELINE
            pipe = load_pipeline(SanaPipeline, path, DEFAULT_PIPELINE, full_dtype, gated=False, transformer=None)
            config = _transformer_config(path)
            pipe.register_modules(transformer=load_linear_ffn_transformer(config, resolve_checkpoint(checkpoint),
                                                                          full_dtype))
        return cls(pipe, device=device, full_dtype=full_dtype, **kwargs)

    def _encode_batch(self, prompts: list[str]) -> Cond:
        # with an instruction, encode_prompt prepends it and keeps token 0 plus the last max_length - 1
        with self._loaded(*self._text_encoders()):
            embeds, mask, _, _ = self.pipe.encode_prompt(
                prompts, do_classifier_free_guidance=False, device=self.device, clean_caption=False,
                max_sequence_length=self.max_sequence_length,
                complex_human_instruction=self.complex_human_instruction)
        return Cond({"prompt_embeds": embeds.float(), "attention_mask": mask})

    def uncond_cond(self) -> Cond:
        """The pipeline's negative prompt: "" without the instruction and without token selection."""
        if self._uncond is None:
            with torch.no_grad(), self._loaded(*self._text_encoders()):
                embeds, mask = self.pipe._get_gemma_prompt_embeds(
                    prompt=[self.uncond_prompt], device=self.device, dtype=self.full_dtype, clean_caption=False,
                    max_sequence_length=self.max_sequence_length, complex_human_instruction=False)
            self._uncond = Cond({"prompt_embeds": embeds.float(), "attention_mask": mask})
        return self._uncond

    def _forward(self, net: nn.Module, x_t: Tensor, t: Tensor, cond: Cond, guidance: float | None) -> Tensor:
        dtype = net_dtype(net)
        return net(
            x_t.to(dtype),
            encoder_hidden_states=cond["prompt_embeds"].to(dtype),
            encoder_attention_mask=cond["attention_mask"],
            timestep=t.float() * 1000 * self.transformer.config.timestep_scale,
            return_dict=False,
        )[0].float()

    def _decode_chunk(self, vae, latents: Tensor) -> Tensor:
        return vae.decode((latents / vae.config.scaling_factor).to(vae.dtype), return_dict=False)[0]

    def flops_per_forward(self) -> float | None:
        _, h, w = self.latent_shape
        return flops.sana_forward_flops(dict(self.transformer.config), latent_hw=(h, w),
                                        text_tokens=self.max_sequence_length)


def _build(cfg, device, dtype) -> SanaAdapter:
    return build_pretrained(SanaAdapter, cfg, device, dtype, prompt_instruction=bool(cfg.prompt_instruction),
                            checkpoint=cfg.checkpoint)


CARD = ModelCard(
    name="sana", order=3, build=_build, adapter=SanaAdapter, pipeline="SanaPipeline", explore_recipe="nvfp4_sana",
    lora_init="gaussian", micro_batch={"rollout": 32, "reward": 32, "train": 16}, native_resolution=1024,
    text_max_length=SanaAdapter.max_sequence_length,
    settings=("text_max_length", "prompt_instruction", "checkpoint"), setting_defaults={"prompt_instruction": False},
    # The linear-FFN SANA 1.0 1.6B Sol-RL trains (sana_main's model.checkpoint on the Sana_1600M pipeline;
    # solbench.models.sana_linear), 20 blocks of 2240 over image tokens only (DC-AE /32, patch 1), 300 Gemma
    # tokens by cross-attention, CFG; LoRA on 20 x 8 layers (self and cross attention). Without model.checkpoint
    # a run loads the adapter's own default (SANA-1.5).
    weights=ModelWeights("sana", "SANA 1.0 1.6B (linear FFN)", DEFAULT_PIPELINE, False,
                         "see the model card (NVIDIA, non-commercial)", 1.6, 2.9,
                         blocks=20, hidden=2240, text_tokens=0, pixels_per_token=32, cfg=True,
                         lora_params_per_rank_m=160 * 4480 / 1e6, vae_decode_gb_1024=1.2,
                         repo_without_checkpoint=DEFAULT_ID),
    # SanaPipeline: Gemma-2 2B
    files={"transformer": DIFFUSERS_MODEL, "vae": DIFFUSERS_MODEL, "text_encoder": TEXT_MODEL,
           "tokenizer": GEMMA_TOKENIZER, "scheduler": SCHEDULER},
    # The model Sol-RL trains on SANA (NVlabs/Sana configs/sol_rl/sana.py: Sana1.0_1600M_linear.yaml, and
    # experiments/sana_main.yaml's model.checkpoint): SANA 1.0 1.6B (no q/k norm) with its feed-forward's
    # two 1x1 convolutions as Linear layers, which the NVFP4 recipe quantizes (SANA-1.5's Conv2d it cannot).
    transformer=flops.RealModelSpec(
        hub_id=DEFAULT_PIPELINE,
        class_name="SanaTransformer2DModel",
        config=dict(in_channels=32, out_channels=32, num_attention_heads=70, attention_head_dim=32, num_layers=20,
                    num_cross_attention_heads=20, cross_attention_head_dim=112, cross_attention_dim=2240,
                    caption_channels=2304, mlp_ratio=2.5, sample_size=32, patch_size=1,
                    norm_elementwise_affine=False, norm_eps=1e-6, **{flops.LINEAR_FFN: True}),
        resolution=1024, vae_factor=32, text_tokens=300,  # DC-AE f32; Gemma-2 prompt length
    ),
    vae="dcae_f32c32",
    # 7 self-attention heads x 32, 2 cross-attention heads x 112 (width 224), MLP ratio 2.5 kept
    probe=Probe({"num_attention_heads": 7, "num_cross_attention_heads": 2, "cross_attention_dim": 224,
                 "caption_channels": 64, "num_layers": 2}, 224, {16: 4, 64: 8}),
)
