"""Cost projection for planning GPU time: the paper models' FLOPs priced on a hardware profile.

ALWAYS A PROJECTION, never a measurement: every table this module produces says so in its title and
caption, and none is mixed with measured timings.

Its inputs are stored results, not code: each model's FLOPs per forward split into ``linear`` (the layers an
NVFP4 recipe quantizes, ``quantized`` of them under the model's recipe) and ``attention`` (kept in BF16), its
resolution, text tokens, recipe, trained timesteps, forwards per step and text-encoder, VAE and reward FLOPs
are the table paper_model_facts.parquet that ``solbench collect`` writes beside the runs (solbench.measure.paper_models
computes them in closed form from the architecture configs and the real specs; solbench.results.stored_facts names
them). Results collected before that table existed get a note naming the command that adds it.

Seconds per iteration in the paper's setting (``PaperSetting``: 48 prompt groups per iteration on 8
GPUs, N = 96, K = 24, 10 full steps, 6 explore steps) with, per model (``PAPER_MODELS``, from the public
configs): resolution R, forwards per sampling step c (2 with classifier-free guidance), trained
timesteps T_tr, text-encoder FLOPs per prompt E, VAE-decode V and reward W FLOPs per image. With u the
utilisation of every GEMM-like op (of its own peak) and u_a that of fused attention:

- forward  f = F_lin / (P_bf16 u) + F_att / (P_bf16 u_a);  explore forward f_e: the quantized linears
  F_q at P_low (NVFP4 on B200, FP8 on Hopper), the rest as f
- naive BF16 rollout = [P N (T c f + (V + W) / (P_bf16 u)) + P E / (P_bf16 u)] / G
- Sol-RL rollout = [P N (T_e c f_e + ...) + P K (T c f + ...) + 2 P E / ...] / G
- training (both) = P K T_tr 5 f / G (policy forward + backward with recompute, old policy, reference)
- end to end = rollout + training (+ re-quantization for Sol-RL, a share of its iteration).

Text tokens are the ones each real spec encodes (``model.text_max_length``: FLUX 128, SD3.5-L 77 + 128,
SANA 300), not the pipelines' maxima: an H200 measured FLUX's 512 px forward at the 128-token count
(docs/measured/H200.md).

docs/reports.md ("Cost projection") sources every number; a test asserts every FLUX.1 and SANA cell within 25 %
of Table 5 and their speedups within 15 %; SD3.5-L's rollouts fall outside (faster in Table 5 than two forwards
per step at FLUX's utilisation, and its Sol-RL rollout short of the paper's speedup: the reference's SD3 rule
quantizes 49 % of a forward: 1.7x projected against the paper's 2.4x).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import pandas as pd

from solbench.report.hardware import HARDWARE, Hardware, get_hardware  # noqa: F401 (importable here too)
from solbench.report.registry import Note, Table, report_kind
from solbench.report.stored import missing, paper_model_facts
from solbench.report.tables import Tables
from solbench.results.stored_facts import ForwardFlops, ModelSetting, model_setting


def forward_seconds(f: ForwardFlops, hw: Hardware, *, explore: bool = False, mfu: float = 0.215,
                    attention_mfu: float = 0.75) -> float:
    """Projected seconds of one transformer forward of one image on one GPU of ``hw``: the linear FLOPs at
    the BF16 peak (the ``quantized`` part at the low-precision peak when ``explore``) x ``mfu``, the
    attention products at the BF16 peak x ``attention_mfu``. A PROJECTION, as everything in this module."""
    bf16 = hw.bf16 * 1e15
    quantized = (f.linear if f.quantized is None else f.quantized) if explore else 0.0
    low_peak, _ = hw.explore_peak()
    return (quantized / (low_peak * 1e15 * mfu) + (f.linear - quantized) / (bf16 * mfu)
            + f.attention / (bf16 * attention_mfu))


# ---- the paper's Table 5 and its setting ----------------------------------------------------------

#: Seconds per iteration on 8x B200, naive BF16 scaling (24-in-96) vs Sol-RL. Source: Sol-RL,
#: "FP4 Explore, BF16 Train", arXiv 2604.06916, Table 5 (as copied in shared/reference/paper.md).
PAPER_TABLE5 = pd.DataFrame([
    {"model": "flux", "label": "FLUX.1", "rollout_naive": 184, "rollout_sol": 79, "e2e_naive": 274, "e2e_sol": 169},
    {"model": "sd3", "label": "SD3.5-L", "rollout_naive": 451, "rollout_sol": 187, "e2e_naive": 691, "e2e_sol": 427},
    {"model": "sana", "label": "SANA", "rollout_naive": 65, "rollout_sol": 46, "e2e_naive": 95, "e2e_sol": 76},
])
PAPER_CITATION = "Sol-RL (arXiv 2604.06916), Table 5: seconds per iteration on 8x B200"


#: Inputs of the projection that were inferred from the paper's own Table 5 (so agreement with Table 5
#: is partly built in, not independent validation); docs/reports.md lists them with the rest.
FITTED = {
    "mfu": "the 21.5 % utilisation of GEMM-like work is what FLUX's training phase in Table 5 implies "
           "((274 - 184) s for its training forwards; its rollout implies the same)",
    "rollout_passes": "two forwards per sampling step (CFG) for SD3.5-L and SANA: the public configs set guidance "
                      "1.0 (one forward); at FLUX's utilisation Table 5's rollouts lie between one and two, nearer two",
}


@dataclass(frozen=True)
class PaperSetting:
    """One iteration of the paper's runs (paper.md: 48 prompt groups per iteration on 8 GPUs)."""

    prompts_per_iter: int = 48
    gpus: int = 8
    n: int = 96  # candidates per prompt (naive scaling and Sol-RL explore)
    k: int = 24  # trained samples per prompt
    full_steps: int = 10  # BF16 rollout steps
    explore_steps: int = 6  # Sol-RL FP4 preview steps
    train_forwards: float = 5.0  # policy fwd + bwd with checkpointing (3) + old policy (1) + reference (1)
    mfu: float = 0.215  # utilisation of every GEMM-like op (BF16, NVFP4, convolutions), of its own peak: FITTED
    attention_mfu: float = 0.75  # utilisation of the fused attention kernels (BF16)
    requant_share: float = 0.02  # re-quantization after each update: share of the Sol-RL iteration


def stored_models(facts: pd.DataFrame | None) -> dict[str, ModelSetting] | None:
    """{model: ModelSetting} of the paper's three models from their collected facts (``paper_model_facts``; None:
    these results lack them)."""
    if facts is None or set(facts["model"]) != set(PAPER_TABLE5["model"]):
        return None
    return {str(row["model"]): model_setting(row) for _, row in facts.iterrows()}


def project_iteration(m: ModelSetting, hw: Hardware, setting: PaperSetting | None = None,
                      mfu: float | None = None) -> dict[str, float]:
    """Projected seconds per iteration of the model ``m`` describes in the paper's setting.

    Per image: T sampling steps of ``rollout_passes`` forwards, one VAE decode and one reward call; per
    prompt one text encoding. Sol-RL's explore runs the layers its recipe quantizes at the low-precision
    peak (``forward_seconds``). Training: K samples x train_timesteps x train_forwards forwards (no CFG).
    ``mfu`` overrides the setting's GEMM utilisation.
    """
    s = setting or PaperSetting()
    mfu = s.mfu if mfu is None else mfu
    if not 0 < mfu <= 1:
        from solbench.errors import ConfigError

        raise ConfigError(f"mfu must be in (0, 1], got {mfu}")
    f = m.flops
    forward = forward_seconds(f, hw, mfu=mfu, attention_mfu=s.attention_mfu)
    forward_low = forward_seconds(f, hw, explore=True, mfu=mfu, attention_mfu=s.attention_mfu)
    bf16 = hw.bf16 * 1e15
    per_image = (m.vae_tflops + m.reward_tflops) * 1e12 / (bf16 * mfu)  # decode + score
    text = m.text_tflops * 1e12 / (bf16 * mfu)
    P, G = s.prompts_per_iter, s.gpus
    naive_rollout = (P * s.n * (s.full_steps * m.rollout_passes * forward + per_image) + P * text) / G
    explore = (P * s.n * (s.explore_steps * m.rollout_passes * forward_low + per_image) + P * text) / G
    regenerate = (P * s.k * (s.full_steps * m.rollout_passes * forward + per_image) + P * text) / G
    train = P * s.k * m.train_timesteps * s.train_forwards * forward / G
    requant = s.requant_share / (1 - s.requant_share) * (explore + regenerate + train)
    return {"rollout_naive": naive_rollout, "rollout_sol": explore + regenerate, "explore": explore,
            "regenerate": regenerate, "train": train, "requant": requant, "e2e_naive": naive_rollout + train,
            "e2e_sol": explore + regenerate + train + requant}


def paper_projection(models: Mapping[str, ModelSetting], hardware: str = "B200", mfu: float | None = None,
                     setting: PaperSetting | None = None) -> pd.DataFrame:
    """Projected Table 5 for FLUX.1, SD3.5-L and SANA (``models``: their settings and FLOPs, ``stored_models``)
    beside the paper's numbers, with relative errors.

    ``mfu`` None uses the setting's utilisation (the value documented in docs/reports.md)."""
    hw = get_hardware(hardware)
    setting = setting or PaperSetting()
    rows = []
    for _, paper in PAPER_TABLE5.iterrows():
        m = models[paper["model"]]
        f = m.flops
        proj = project_iteration(m, hw, setting, mfu)
        row = {"model": paper["label"], "hardware": hw.name, "mfu": setting.mfu if mfu is None else mfu,
               "resolution": m.resolution, "text_tokens": m.text_tokens, "recipe": m.recipe,
               "rollout_passes": m.rollout_passes,
               "train_timesteps": m.train_timesteps, "tflops_per_forward": f.total / 1e12,
               "attention_share": f.attention / f.total,
               "quantized_share": (f.linear if f.quantized is None else f.quantized) / f.total}
        for key in ("rollout_naive", "rollout_sol", "e2e_naive", "e2e_sol"):
            row[f"{key}_projected_s"] = proj[key]
            if hw.name == "B200":
                row[f"{key}_paper_s"] = float(paper[key])
                row[f"{key}_rel_error"] = proj[key] / float(paper[key]) - 1.0
        row["rollout_speedup_projected"] = proj["rollout_naive"] / proj["rollout_sol"]
        row["e2e_speedup_projected"] = proj["e2e_naive"] / proj["e2e_sol"]
        if hw.name == "B200":
            row["rollout_speedup_paper"] = paper["rollout_naive"] / paper["rollout_sol"]
            row["e2e_speedup_paper"] = paper["e2e_naive"] / paper["e2e_sol"]
            row["rollout_speedup_rel_error"] = row["rollout_speedup_projected"] / row["rollout_speedup_paper"] - 1
            row["e2e_speedup_rel_error"] = row["e2e_speedup_projected"] / row["e2e_speedup_paper"] - 1
        rows.append(row)
    return pd.DataFrame(rows)


def _pct(x: float) -> str:
    return f"{x:+.0%}" if math.isfinite(x) else "-"


@report_kind("cost_projection", title="Cost projection (PROJECTION, not measured)", order=70)
def cost_projection(tables: Tables):
    """Projected seconds per iteration from architecture FLOPs and a hardware profile, beside Table 5."""
    opts = tables.options
    hw = get_hardware(opts.hardware)
    setting = PaperSetting()
    facts = paper_model_facts(tables)
    models = stored_models(facts)
    outputs = []
    if models is None:
        outputs.append(Note("Cost projection of the paper's models", missing(
            "the paper models' facts (paper_model_facts.parquet: FLOPs per forward and the share each recipe "
            "quantizes, resolution, text tokens, trained timesteps), so Table 5 is not projected")))
    for hw_name in dict.fromkeys([hw.name, "B200"]) if models is not None else ():
        df = paper_projection(models, hw_name, None, setting)  # the documented utilisations, not --mfu
        display = []
        for _, r in df.iterrows():
            row = {"model": r["model"], "px": int(r["resolution"]), "text tokens": int(r["text_tokens"]),
                   "passes/step": int(r["rollout_passes"]),
                   "trained t": int(r["train_timesteps"]), "TFLOP/forward": f"{r['tflops_per_forward']:.2f}",
                   "attention share": f"{r['attention_share']:.1%}",
                   "NVFP4 share (recipe)": f"{r['quantized_share']:.0%} ({r['recipe']})"}
            for key, label in (("rollout_naive", "rollout naive"), ("rollout_sol", "rollout Sol-RL"),
                               ("e2e_naive", "E2E naive"), ("e2e_sol", "E2E Sol-RL")):
                cell = f"{r[f'{key}_projected_s']:.0f}"
                if f"{key}_paper_s" in r and pd.notna(r.get(f"{key}_paper_s")):
                    cell += f" (paper {r[f'{key}_paper_s']:.0f}, {_pct(r[f'{key}_rel_error'])})"
                row[f"{label} (s)"] = cell
            sp = f"{r['rollout_speedup_projected']:.2f}x / {r['e2e_speedup_projected']:.2f}x"
            if "rollout_speedup_paper" in r and pd.notna(r.get("rollout_speedup_paper")):
                sp += f" (paper {r['rollout_speedup_paper']:.2f}x / {r['e2e_speedup_paper']:.2f}x)"
            row["speedup rollout / E2E"] = sp
            display.append(row)
        low_peak, low_name = HARDWARE[hw_name].explore_peak()
        caption = (
            f"PROJECTION from FLOPs, not a measurement. Hardware profile {hw_name} ({HARDWARE[hw_name].source}): BF16 "
            f"{HARDWARE[hw_name].bf16} PFLOP/s, explore in {low_name} at {low_peak} PFLOP/s (only the layers the "
            f"model's NVFP4 recipe quantizes; attention stays BF16). Every GEMM-like op (BF16, {low_name}, VAE "
            f"convolutions) at {setting.mfu:.1%} of its peak, fused attention at {setting.attention_mfu:.0%}. Setting "
            f"of the paper's runs: {setting.prompts_per_iter} prompt groups per iteration on {setting.gpus} GPUs, "
            f"N={setting.n}, K={setting.k}, {setting.full_steps} full and {setting.explore_steps} explore steps; per "
            f"model its public config's resolution, forwards per step (2 = CFG) and trained timesteps (columns), "
            f"x {setting.train_forwards:g} forward-equivalents per trained timestep, text encoders per prompt, a VAE "
            f"decode and a reward call per image, re-quantization {setting.requant_share:.0%} of the Sol-RL iteration. "
            "Resolution, text tokens (model.text_max_length; SD3.5-L adds CLIP's 77), recipe and trained timesteps "
            "(int(steps x timestep_fraction)) are those of the Sol-RL run "
            f"of each model's real spec ({', '.join(facts['spec'].astype(str))}); the NVFP4 share is the FLOPs of the "
            "Linear layers that recipe quantizes (the rule quantized_copy applies, layer by layer) over the whole "
            "forward. FITTED, not independent: " + "; ".join(FITTED.values()) + ", so agreement with Table 5 is "
            "partly built in. Every assumption and its source: docs/reports.md, Cost projection. Not modelled: "
            "communication, the optimizer step, data loading."
            + (f" In parentheses: {PAPER_CITATION}, and the projection's relative error. SD3.5-L's Sol-RL rollout "
               "falls short of the paper's speedup: the reference's SD3 rule (nvfp4_sd3, min_dim 2432) keeps every "
               "square attention projection in BF16, so its NVFP4 share is the quantized_share column's, not "
               "FLUX's. SD3.5-L's and SANA's rollouts are faster in Table 5 than two forwards per step at FLUX's "
               "utilisation project (one forward would be as far below)." if hw_name == "B200" else "")
        )
        outputs.append(Table(f"cost_projection_{hw_name.lower()}", f"PROJECTED seconds per iteration on 8x {hw_name}",
                             df, caption, display=pd.DataFrame(display)))
    from solbench.report.clock import own_flops_projection

    measured = own_flops_projection(tables, hw)
    if measured is not None:
        outputs.append(measured)
    return outputs


def setting_dict(setting: PaperSetting | None = None) -> dict:
    return asdict(setting or PaperSetting())
