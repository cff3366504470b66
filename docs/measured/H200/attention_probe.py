"""One-off diagnosis of the illegal memory access in flux_main's train phase (H200, torch 2.11), kept as run.

    CUDA_LAUNCH_BLOCKING=1 [CUDNN_SDP=0] python attention_probe.py CASE 16

CASE: sdpa_default | sdpa_cudnn | sdpa_flash | sdpa_eff (bare SDPA, 16 x 24 heads x 4224 tokens x 128, bf16,
forward + backward) or flux | flux_nockpt (diffusers' FluxTransformer2DModel at FLUX.1's width, 2 double and 2
single blocks, 4096 image + 128 text tokens, fp32 LoRA r 32 on the attention projections, with or without
gradient checkpointing, forward + backward). Each case in its own process: an illegal address ends the context.
CUDNN_SDP=0 switches cuDNN attention off first (the fix, solbench.models.diffusers_common.avoid_cudnn_attention).
Results: attention_probe_before_fix.txt, attention_probe_after_fix.txt (docs/measured/H200.md).
"""
import sys, time, json, torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
case = sys.argv[1]
B = int(sys.argv[2]) if len(sys.argv) > 2 else 16
import os; torch.backends.cuda.enable_cudnn_sdp(os.environ.get("CUDNN_SDP", "1") == "1"); dev = os.environ.get("DEV", "cuda")
res = {"case": case, "B": B, "torch": torch.__version__}
t0 = time.time()
try:
    if case.startswith("sdpa_"):
        be = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_eff": SDPBackend.EFFICIENT_ATTENTION,
              "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa_default": None}[case]
        q, k, v = (torch.randn(B, 24, 4224, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        ctx = sdpa_kernel([be]) if be is not None else torch.enable_grad()
        with ctx:
            o = F.scaled_dot_product_attention(q, k, v)
            o.float().square().mean().backward()
        torch.cuda.synchronize()
    elif case.startswith("flux"):  # two double + two single blocks at FLUX.1's width, fp32 LoRA
        from diffusers import FluxTransformer2DModel
        from peft import LoraConfig
        m = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2, attention_head_dim=128,
                                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                                   guidance_embeds=True, axes_dims_rope=[16, 56, 56]).to(dev, torch.bfloat16)
        m.requires_grad_(False)
        if case != "flux_nockpt":
            m.enable_gradient_checkpointing()
        m.add_adapter(LoraConfig(r=32, lora_alpha=64, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        for p in m.parameters():
            if p.requires_grad: p.data = p.data.float()
        ids = torch.zeros(4096, 3, device=dev); ids[:, 1] = torch.arange(4096, device=dev) // 64; ids[:, 2] = torch.arange(4096, device=dev) % 64
        out = m(hidden_states=torch.randn(B, 4096, 64, device=dev, dtype=torch.bfloat16),
                encoder_hidden_states=torch.randn(B, 128, 4096, device=dev, dtype=torch.bfloat16),
                pooled_projections=torch.randn(B, 768, device=dev, dtype=torch.bfloat16),
                timestep=torch.full((B,), 0.5, device=dev, dtype=torch.bfloat16), guidance=torch.ones(B, device=dev),
                img_ids=ids, txt_ids=torch.zeros(128, 3, device=dev), return_dict=False)[0]
        out.float().square().mean().backward()
        torch.cuda.synchronize()
    res["ok"] = True
except Exception as e:
    res["ok"] = False; res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    import traceback; tb = traceback.format_exc().splitlines(); res["where"] = [l for l in tb if "File" in l][-6:]
res["s"] = round(time.time() - t0, 1)
res["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1) if res.get("ok") and dev == "cuda" else None
print("PROBE", json.dumps(res), flush=True)
