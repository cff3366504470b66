"""FLUX, SD3 and SANA adapters on tiny random components of the real classes (no hub access).

Oracle: the diffusers pipeline itself. From the same initial latents, a 2-step run of the pipeline
(its own prompt encoding, packing, guidance, scheduler and VAE decode) must equal the engine's
Euler rollout through the adapter.
"""

import string

import pytest
import torch

from solbench.engine.engine import Engine, SamplerSpec
from solbench.errors import MissingWeightsError
from solbench.models.base import shifted_sigmas
from solbench.engine.noise import candidate_noise
from solbench.engine.timing import PhaseTimer

LETTERS = list(string.ascii_lowercase)
PROMPTS = ["a red cube", "two blue balls"]


def clip_parts(with_projection=False):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1, "!": 2}
    for c in LETTERS:
        vocab.setdefault(c, len(vocab))
        vocab.setdefault(c + "</w>", len(vocab))
    config = CLIPTextConfig(bos_token_id=0, eos_token_id=1, hidden_size=32, intermediate_size=37, num_attention_heads=4,
                            num_hidden_layers=2, pad_token_id=1, vocab_size=100, projection_dim=32)
    cls = CLIPTextModelWithProjection if with_projection else CLIPTextModel
    return cls(config).eval(), CLIPTokenizer(vocab=vocab, merges=[], model_max_length=77)


def t5_parts():
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    tok = T5Tokenizer(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -1.0)] + [(c, -2.0) for c in LETTERS])
    model = T5EncoderModel(T5Config(vocab_size=40, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4))
    return model.eval(), tok


def kl_vae(latent_channels):
    from diffusers import AutoencoderKL

    return AutoencoderKL(sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1,
                         latent_channels=latent_channels, norm_num_groups=1, use_quant_conv=False,
                         use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035).eval()


def flux_components():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    torch.manual_seed(0)
    text_encoder, tokenizer = clip_parts()
    text_encoder_2, tokenizer_2 = t5_parts()
    transformer = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                         pooled_projection_dim=32, axes_dims_rope=[4, 4, 8], guidance_embeds=True)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                                base_image_seq_len=256, max_image_seq_len=4096)
    return dict(transformer=transformer, vae=kl_vae(1), text_encoder=text_encoder, tokenizer=tokenizer,
                text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, scheduler=scheduler)


def sd3_components():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel

    torch.manual_seed(0)
    text_encoder, tokenizer = clip_parts(with_projection=True)
    text_encoder_2, tokenizer_2 = clip_parts(with_projection=True)
    text_encoder_3, tokenizer_3 = t5_parts()
    transformer = SD3Transformer2DModel(sample_size=32, patch_size=1, in_channels=4, num_layers=1,
                                        attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
                                        joint_attention_dim=32, pooled_projection_dim=64, out_channels=4)
    return dict(transformer=transformer, vae=kl_vae(4), text_encoder=text_encoder, tokenizer=tokenizer,
                text_encoder_2=text_encoder_2, tokenizer_2=tokenizer_2, text_encoder_3=text_encoder_3,
                tokenizer_3=tokenizer_3, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def sana_components():
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaTransformer2DModel
    from transformers import Gemma2Config, Gemma2Model, GemmaTokenizer

    torch.manual_seed(0)
    transformer = SanaTransformer2DModel(patch_size=1, in_channels=4, out_channels=4, num_layers=1,
                                         num_attention_heads=2, attention_head_dim=4, num_cross_attention_heads=2,
                                         cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
                                         sample_size=16)
    vae = AutoencoderDC(in_channels=3, latent_channels=4, attention_head_dim=2,
                        encoder_block_types=("ResBlock", "EfficientViTBlock"),
                        decoder_block_types=("ResBlock", "EfficientViTBlock"),
                        encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                        encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
                        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1],
                        downsample_block_type="conv", upsample_block_type="interpolate",
                        decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407).eval()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, **{c: i + 4 for i, c in enumerate(LETTERS + ["▁"])}}
    tokenizer = GemmaTokenizer(vocab=vocab, merges=[])
    text_encoder = Gemma2Model(Gemma2Config(head_dim=16, hidden_size=8, intermediate_size=64, num_attention_heads=2,
                                            num_hidden_layers=1, num_key_value_heads=2, vocab_size=len(vocab),
                                            max_position_embeddings=8192, attn_implementation="eager")).eval()
    return dict(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0))


def engine_rollout(adapter, steps, guidance):
    engine = Engine(adapter, {"policy": adapter.transformer}, None, PhaseTimer(), run_seed=0)
    ids = [f"p{i}" for i in range(len(PROMPTS))]
    rollout = engine.sample(ids, PROMPTS, [0] * len(PROMPTS), sampler=SamplerSpec("euler", steps, guidance=guidance),
                            phase="eval", stream="eval")
    noise, _ = candidate_noise(0, "eval", ids, [0] * len(PROMPTS), adapter.latent_shape)
    return rollout, noise


def pipeline_sigmas(steps):
    return [float(s) for s in torch.linspace(1.0, 1.0 / steps, steps)]


def check_common(adapter, expect_latent_shape):
    assert adapter.latent_shape == expect_latent_shape
    cond = adapter.encode(PROMPTS)
    assert len(cond) == 2 and all(t.shape[0] == 2 for t in cond.tensors.values())
    again = adapter.encode([PROMPTS[1]])  # cached per prompt: the same tensors
    assert all(torch.equal(again[k][0], cond[k][1]) for k in cond.tensors)
    x = torch.randn(2, *adapter.latent_shape)
    v = adapter.velocity(adapter.transformer, x, torch.tensor([1.0, 0.5]), cond)
    assert v.shape == x.shape and v.dtype == torch.float32 and torch.isfinite(v).all()
    images = adapter.decode(x)
    assert images.shape[:2] == (2, 3) and 0 <= images.min() and images.max() <= 1
    assert adapter.flops_per_forward() > 0


def test_flux_adapter_matches_the_flux_pipeline():
    from solbench.models.flux import FluxAdapter

    adapter = FluxAdapter.from_components(**flux_components(), resolution=32, max_sequence_length=16)
    check_common(adapter, (1, 32, 32))
    assert adapter.guidance_mode == "distilled" and adapter.default_guidance == 3.5
    rollout, noise = engine_rollout(adapter, steps=2, guidance=3.5)
    pipe = adapter.pipe
    packed = pipe._pack_latents(noise, 2, 1, 32, 32)
    expected = pipe(PROMPTS, height=32, width=32, num_inference_steps=2, sigmas=pipeline_sigmas(2), guidance_scale=3.5,
                    latents=packed, max_sequence_length=16, output_type="pt").images
    torch.testing.assert_close(rollout.images, expected, rtol=1e-4, atol=1e-4)
    # distilled guidance is an input: another scale, another image
    other, _ = engine_rollout(adapter, steps=2, guidance=1.0)
    assert not torch.allclose(other.images, rollout.images)
    # the schedule is the pipeline's resolution-dependent shift
    pipe.scheduler.set_timesteps(sigmas=pipeline_sigmas(4), mu=__import__("math").log(adapter.default_shift))
    torch.testing.assert_close(adapter.sigmas(4), pipe.scheduler.sigmas.float(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_sd3_adapter_matches_the_sd3_pipeline(guidance):
    from solbench.models.sd3 import SD3Adapter

    adapter = SD3Adapter.from_components(**sd3_components(), resolution=32, max_sequence_length=16)
    check_common(adapter, (4, 32, 32))
    rollout, noise = engine_rollout(adapter, steps=2, guidance=guidance)
    expected = adapter.pipe(PROMPTS, height=32, width=32, num_inference_steps=2, sigmas=pipeline_sigmas(2),
                            guidance_scale=guidance, latents=noise, max_sequence_length=16, output_type="pt").images
    torch.testing.assert_close(rollout.images, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("prompt_instruction", [False, True])
def test_sana_adapter_matches_the_sana_pipeline(prompt_instruction):
    """Catches (False, issue 23): the adapter prepending SanaPipeline's complex human instruction to every
    prompt, where Sol-RL's train_sana.py encodes the prompt alone (encode_prompt's default None)."""
    from solbench.models.sana import SanaAdapter

    adapter = SanaAdapter.from_components(**sana_components(), resolution=32, max_sequence_length=8,
                                          prompt_instruction=prompt_instruction)
    check_common(adapter, (4, 16, 16))
    rollout, noise = engine_rollout(adapter, steps=2, guidance=4.5)
    instruction = {} if prompt_instruction else {"complex_human_instruction": None}  # __call__'s default has one
    expected = adapter.pipe(PROMPTS, height=32, width=32, num_inference_steps=2, sigmas=pipeline_sigmas(2),
                            guidance_scale=4.5, latents=noise, max_sequence_length=8, output_type="pt",
                            use_resolution_binning=False, **instruction).images
    torch.testing.assert_close(rollout.images, expected, rtol=1e-4, atol=1e-4)


def test_text_encoders_default_to_the_references_128_tokens():
    """Catches (issue 23): FLUX encoding 512 and SD3 256 T5 tokens where every reference encodes 128
    (Sana train_flux1.py / train_sd3.py TEXT_ENCODER_MAX_SEQ_LEN, flow_grpo max_sequence_length=128);
    FLUX and SD3 attend to the padding, so the length changes the conditioning and the cost."""
    from solbench.models.flux import FluxAdapter
    from solbench.models.sd3 import SD3Adapter

    flux = FluxAdapter.from_components(**flux_components(), resolution=32)
    assert flux.encode(["a red cube"])["prompt_embeds"].shape[1] == 128
    sd3 = SD3Adapter.from_components(**sd3_components(), resolution=32)
    assert sd3.encode(["a red cube"])["prompt_embeds"].shape[1] == 77 + 128  # CLIP tokens, then T5
    assert SD3Adapter.from_components(**sd3_components(), resolution=32, max_sequence_length=16).encode(
        ["a red cube"])["prompt_embeds"].shape[1] == 77 + 16


def test_sd3_time_embedding_gets_the_fp32_timestep_in_bf16():
    """Catches (issue 23): the SD3 adapter casting t * 1000 to the network's bf16 before the time
    embedding (bf16 spacing is 4 between 512 and 1000, so 753.1 became 752); the pipeline and Sol-RL's
    train_sd3.py pass the scheduler's fp32 timesteps."""
    from solbench.models.sd3 import SD3Adapter

    adapter = SD3Adapter.from_components(**sd3_components(), resolution=32, max_sequence_length=16)
    net = adapter.transformer.to(torch.bfloat16)
    seen = []
    hook = net.time_text_embed.register_forward_pre_hook(lambda module, args: seen.append(args[0].clone()))
    cond = adapter.encode(PROMPTS)
    t = torch.tensor([0.7531, 0.5127])
    adapter.velocity(net, torch.randn(2, *adapter.latent_shape), t, cond, guidance=1.0)
    hook.remove()
    assert seen[0].dtype == torch.float32
    torch.testing.assert_close(seen[0], t * 1000, rtol=0, atol=0)


@pytest.mark.parametrize("name,model_id", [("flux", "black-forest-labs/FLUX.1-dev"),
                                           ("sd3", "stabilityai/stable-diffusion-3.5-large"),
                                           ("sana", "Efficient-Large-Model/SANA1.5_1.6B_1024px_diffusers")])
def test_missing_weights_name_the_model_and_how_to_get_them(name, model_id):
    from solbench.config import ModelConfig
    from solbench.models import build_adapter

    with pytest.raises(MissingWeightsError) as err:
        build_adapter(ModelConfig(name=name), "cpu")
    message = str(err.value)
    assert model_id in message and f"hf download {model_id}" in message and "huggingface-cli" not in message
    assert ("gated" in message) == (name != "sana")


def test_a_real_adapter_takes_cudnn_out_of_torchs_attention_backends():
    """The bug: FLUX.1's attention backward failing in cuDNN's fused attention at training shapes (an illegal
    memory access in the train phase on an H200, torch 2.11; docs/measured/H200.md). Building any real
    adapter must switch cuDNN attention off (flash and memory-efficient attention stay on)."""
    import torch

    from solbench.models.flux import FluxAdapter

    before = (torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled())
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        FluxAdapter.from_components(**flux_components(), resolution=32, max_sequence_length=16)
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before[0])
