"""Sol-RL: explore many seeds in FP4, regenerate the chosen few in full precision, train with NFT.

Paper: "FP4 Explore, BF16 Train: Diffusion Reinforcement Learning via Efficient Rollout Scaling",
arXiv 2604.06916. Reference repository: NVlabs/Sana train_scripts/sol_rl/train_{flux1,sd3,sana}.py
and configs/sol_rl/ (``_rollout_for_one_prompt``: preview_step, stage1_select_mode).

Per iteration and prompt:
1. Explore: N candidates through the explore copy (the old policy merged and quantized, e.g. NVFP4)
   with a short ODE of ``explore_steps`` steps; score them (proxy rewards).
2. Select K by proxy reward (best_worst: top floor(K/2) + bottom ceil(K/2)).
3. Regenerate exactly those seeds (same prompt id and candidate index, so the same initial noise,
   solbench.engine.noise) with the full-precision old policy and the full step budget; score them again.
   Advantages come from these full-precision rewards only.
4. Train with the DiffusionNFT objective, unchanged (methods/diffusion_nft.py).
5. The harness re-syncs (merges and re-quantizes) the explore copy after the update, timed as "sync".

Every explore candidate's proxy reward and every regenerated candidate's full reward are recorded
(candidates table: precision "explore" / "full"), the data behind the ranking-fidelity report.

Deviations from the reference:
- Those of DiffusionNFT and of the selection helpers (stable ties, no duplicates).
- Seeds are derived from (run seed, stream, prompt id, candidate index) instead of drawn from the
  global RNG, so the regenerated sample is bit-identical to sampling that seed directly.
- The reference can select a second time after regeneration (stage2_select_mode with
  full_rollout_num > best_of_n); its Sol-RL configs regenerate exactly K, which is what this does.
"""

from __future__ import annotations

from dataclasses import dataclass

from solbench.method import Batch, Candidate, Iteration, expand_groups, help_field, register
from solbench.method.selection import select_per_group
from solbench.methods.diffusion_nft import DiffusionNFT
from solbench.methods.naive_scaling import KOfN, RolloutScalingConfig


@dataclass
class SolRLConfig(RolloutScalingConfig):
    explore_steps: int = help_field(6, "ODE steps of the low-precision explore stage (the full budget regenerates)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.explore_steps < 1:
            raise ValueError(f"explore_steps must be >= 1, got {self.explore_steps}")


@register
class SolRL(KOfN, DiffusionNFT):
    name = "sol_rl"
    display_name = "Sol-RL"
    Config = SolRLConfig
    axes = ("n", "k", "explore_steps", "selection")
    nets = frozenset({"old", "reference", "explore"})
    tiny_config = {"n": 4, "k": 2, "explore_steps": 2}  # one iteration on the tiny model in seconds
    timed_phases = frozenset({"explore", "select", "regenerate", "reward", "sync"})  # what one iteration times besides "train"

    @classmethod
    def validate(cls, config: SolRLConfig, run):
        if config.explore_steps > run.sampling.steps:
            yield ("method_config.explore_steps", f"{config.explore_steps} explore steps exceed the full rollout budget "
                                                  f"sampling.steps={run.sampling.steps} (the explore stage is the short "
                                                  "one); lower explore_steps or raise sampling.steps")

    def collect(self, engine, prompt_ids, prompts, it: Iteration) -> Batch:
        cfg = self.config
        ids, texts, cand = expand_groups(prompt_ids, prompts, cfg.n)

        # Stage 1: explore N seeds per prompt at low precision with the short step budget.
        explore = engine.sample(ids, texts, cand, net="explore", sampler=self.rollout_spec(cfg.explore_steps),
                                phase="explore", stream=it.stream)
        proxy = engine.score(explore)
        with engine.phase("select"):
            chosen = select_per_group(proxy, cfg.n, cfg.k, cfg.selection, it.generator)

        # Stage 2: regenerate exactly the chosen seeds at full precision with the full budget.
        full = engine.sample([ids[i] for i in chosen], [texts[i] for i in chosen], [cand[i] for i in chosen],
                             net=self.rollout_net, sampler=self.rollout_spec(), phase="regenerate",
                             stream=it.stream)
        rewards = engine.score(full)

        kept = set(chosen)
        candidates = [Candidate(p, c, s, "explore", float(r), i in kept)
                      for i, (p, c, s, r) in enumerate(zip(ids, cand, explore.noise_seeds, proxy.tolist()))]
        candidates += [Candidate(p, c, s, "full", float(r), True)
                       for p, c, s, r in zip(full.prompt_ids, full.cand_idx, full.noise_seeds, rewards.tolist())]
        batch = self.training_batch(engine, full, rewards, candidates, n_images=len(ids) + len(chosen),
                                    reward_all=float(proxy.mean()))
        batch.logs["reward_proxy_selected"] = float(proxy[chosen].mean())
        return batch
