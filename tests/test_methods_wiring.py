"""collect() and chunks() of every method on a toy engine that records every call.

The toy engine (no model, no harness) samples with the real samplers (solbench.engine.sampling) over a
3-dimensional latent with one linear velocity field per role, and records, for every call, the
network role, its precision, the guidance it ran with (None resolved to the model's default, 4.5
here, as the real engine does), the step count and the timesteps. The tests then check the wiring
between the stages, which the hand-computed losses (test_methods_math) cannot see. Each test names
the bug it catches:

- a rollout from the wrong role ("policy" instead of "old" for the NFT family) or precision (naive
  FP4 exploring at full precision, Sol-RL exploring with the full step budget);
- Sol-RL computing advantages from the FP4 proxy rewards instead of the regenerated ones, or
  training on the explore samples;
- a rollout or a loss forward (v_theta, v_old, v_ref, v_slow) that drops the run's guidance;
- chunks() that train t = 0, ignore timestep_fraction, or feed the loss another timestep.
"""

from __future__ import annotations

import contextlib
import zlib

import pytest
import torch
from torch import nn

from solbench.method.advantages import group_advantages
from solbench.engine.engine import Rollout
from solbench.method import Iteration, RunInfo, get_method, validate_method_config
from solbench.models.base import shifted_sigmas
from solbench.engine.sampling import sample as run_sampler
from solbench.method.selection import select_per_group

METHODS = ["awm", "dance_grpo", "diffusion_nft", "flow_grpo", "naive_fp4", "naive_scaling", "sol_rl"]
NFT_FAMILY = ["diffusion_nft", "naive_fp4", "naive_scaling", "sol_rl"]
DEFAULT_GUIDANCE = 4.5  # the toy model's default, like SD3.5's CFG: what a dropped guidance falls back to
STEPS = 10
PROMPT_IDS, PROMPTS = ["p0", "p1"], ["a red circle", "two blue squares"]
LATENT = 3

# (phase, role, precision, step budget) of every engine.sample call of one collect(), in order
ROLLOUTS = {
    "diffusion_nft": [("rollout", "old", "full", "full")],
    "naive_scaling": [("rollout", "old", "full", "full")],
    "naive_fp4": [("explore", "explore", "explore", "full")],
    "sol_rl": [("explore", "explore", "explore", "explore"), ("regenerate", "old", "full", "full")],
    "flow_grpo": [("rollout", "policy", "full", "full")],
    "dance_grpo": [("rollout", "policy", "full", "full")],
    "awm": [("rollout", "policy", "full", "full")],
}
# the roles every loss forward may use (all of them must appear)
LOSS_NETS = {**{m: {"policy", "old", "reference"} for m in NFT_FAMILY},
             "awm": {"policy", "old", "reference"},  # "old" is AWM's slow copy
             "flow_grpo": {"policy", "reference"}, "dance_grpo": {"policy"}}


class Linear(nn.Module):
    """v(x, t) = x W^T + t c, one per role, with distinct weights."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = nn.Parameter(torch.eye(LATENT) * 0.5 + 0.1 * torch.randn(LATENT, LATENT, generator=g))
        self.c = nn.Parameter(0.3 * torch.randn(LATENT, generator=g))

    def forward(self, x, t):
        return x @ self.w.T + t[:, None] * self.c


class ToyAdapter:
    default_guidance = DEFAULT_GUIDANCE
    default_shift = 1.0

    def sigmas(self, steps, shift=None):
        return shifted_sigmas(steps, self.default_shift if shift is None else shift)


def _seed(*parts) -> int:
    return zlib.crc32("/".join(map(str, parts)).encode())


def _normal(*parts) -> torch.Tensor:
    return torch.randn(LATENT, generator=torch.Generator().manual_seed(_seed(*parts)))


class RecordingEngine:
    """The engine surface methods use (sample, score, encode, velocity, phase, adapter.sigmas),
    recording every call. Rewards: the sum of x0, plus a per-candidate offset on explore samples so
    that proxy and full-precision rewards rank the same seeds differently."""

    def __init__(self) -> None:
        self.adapter = ToyAdapter()
        self.nets = {"policy": Linear(1), "old": Linear(2), "reference": Linear(3), "explore": Linear(4)}
        self.samples: list[dict] = []
        self.velocities: list[dict] = []
        self.scores: list[dict] = []
        self.phases: list[str] = []
        self.context = "loss"

    def encode(self, prompts):
        return list(prompts)

    def velocity(self, net, x_t, t, cond, guidance=None, *, detach_uncond=False):
        t = torch.as_tensor(t, dtype=torch.float32).expand(x_t.shape[0])
        self.velocities.append({"context": self.context, "net": net, "guidance": self._resolve(guidance),
                                "t": t.detach().clone(), "n": x_t.shape[0], "prompts": list(cond),
                                "detach_uncond": detach_uncond})
        return self.nets[net](x_t, t)

    @staticmethod
    def _resolve(guidance):
        return DEFAULT_GUIDANCE if guidance is None else float(guidance)

    @contextlib.contextmanager
    def phase(self, name, **_):
        self.phases.append(name)
        yield

    def sample(self, prompt_ids, prompts, cand_idx, *, net, sampler, phase, stream, noise_idx=None,
               keep_trajectory=False):
        noise_idx = list(cand_idx) if noise_idx is None else list(noise_idx)
        spec = sampler.resolved(guidance=self.adapter.default_guidance, shift=self.adapter.default_shift)
        self.samples.append({"phase": phase, "net": net, "precision": "explore" if net == "explore" else "full",
                             "guidance": spec.guidance, "steps": spec.steps, "kind": spec.kind,
                             "noise_level": spec.noise_level, "prompt_ids": list(prompt_ids),
                             "cand_idx": list(cand_idx), "noise_idx": noise_idx, "stream": stream})
        x_init = torch.stack([_normal(stream, p, c) for p, c in zip(prompt_ids, noise_idx)])
        sde = [_seed(stream, "sde", p, c) for p, c in zip(prompt_ids, cand_idx)]

        def noise(j):
            return torch.stack([torch.randn(LATENT, generator=torch.Generator().manual_seed(s + j)) for s in sde])

        self.context = phase
        try:
            with torch.no_grad():
                x0, trajectory = run_sampler(
                    lambda x, t: self.velocity(net, x, t, list(prompts), spec.guidance), x_init,
                    self.adapter.sigmas(spec.steps, spec.shift), spec, noise=noise if spec.stochastic else None,
                    keep_trajectory=keep_trajectory)
        finally:
            self.context = "loss"
        return Rollout(prompt_ids=list(prompt_ids), prompts=list(prompts), cand_idx=list(cand_idx),
                       noise_seeds=[_seed(stream, p, c) for p, c in zip(prompt_ids, noise_idx)],
                       precision="explore" if net == "explore" else "full", dtype="toy", x0=x0,
                       images=torch.zeros(len(prompts), 3, 1, 1), sampler=spec, net=net, stream=stream,
                       trajectory=trajectory)

    def score(self, rollout):
        rewards = rollout.x0.sum(1)
        if rollout.precision == "explore":
            rewards = rewards + torch.tensor([(-1) ** c * 0.7 * c for c in rollout.cand_idx])
        self.scores.append({"precision": rollout.precision, "cand_idx": list(rollout.cand_idx),
                            "rewards": rewards.clone()})
        rollout.rewards = rewards
        return rewards


def make_method(name: str, guidance: float | None = 1.0, **overrides):
    cls = get_method(name)
    values = {**cls.tiny_config, "n": 6, "k": 4} if "n" in cls.tiny_config else {**cls.tiny_config, "group_size": 4}
    values.update(overrides)
    config = validate_method_config(name, values)
    return cls(config, RunInfo(prompts_per_iter=len(PROMPT_IDS), steps=STEPS, guidance=guidance))


def iteration(step: int = 1) -> Iteration:
    return Iteration(step=step, stream=f"train/{step}", generator=torch.Generator().manual_seed(step))


def run_iteration(method, engine):
    """collect, then every chunk's loss (with backward, as the trainer does); returns (batch, chunks)."""
    it = iteration()
    batch = method.collect(engine, PROMPT_IDS, PROMPTS, it)
    chunks = []
    for chunk in method.chunks(batch, it):
        start = len(engine.velocities)
        loss, _ = method.loss(engine, chunk)
        loss.backward()
        chunks.append((chunk, engine.velocities[start:]))
    return batch, chunks


# -- rollouts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", METHODS)
def test_rollouts_use_the_method_role_precision_and_step_budget(name):
    """Catches: the NFT family rolling out with "policy" instead of "old"; naive FP4 exploring at full
    precision; Sol-RL exploring with the full budget or regenerating with the explore copy."""
    method = make_method(name)
    engine = RecordingEngine()
    method.collect(engine, PROMPT_IDS, PROMPTS, iteration())
    explore_steps = method.config.explore_steps if name == "sol_rl" else None
    got = [(s["phase"], s["net"], s["precision"], s["steps"]) for s in engine.samples]
    want = [(phase, net, precision, STEPS if budget == "full" else explore_steps)
            for phase, net, precision, budget in ROLLOUTS[name]]
    assert got == want
    assert name != "sol_rl" or explore_steps < STEPS
    assert {v["net"] for v in engine.velocities} == {net for _, net, _, _ in ROLLOUTS[name]}
    assert all(s["stream"] == "train/1" for s in engine.samples)


@pytest.mark.parametrize("name", METHODS)
def test_batches_carry_what_the_trainer_records(name):
    """Catches a batch without the reward logs the trainer writes, a candidates table that misses
    samples or marks trained ones unselected, and micro-batch weights that do not sum to 1."""
    method = make_method(name)
    engine = RecordingEngine()
    batch, chunks = run_iteration(method, engine)
    assert {"reward", "reward_all", "reward_std"} <= set(batch.logs)
    generated = sum(len(s["prompt_ids"]) for s in engine.samples)
    assert len(batch.candidates) == generated == batch.n_images
    trained = batch.data["x0"].shape[0] if "x0" in batch.data else batch.data["xs"].shape[0]
    full = [c for c in batch.candidates if c.precision == "full"]
    if name in ("diffusion_nft", "awm", "dance_grpo"):
        assert all(c.selected for c in batch.candidates) and len(full) == trained
    assert sum(c.selected for c in batch.candidates if c.precision == ("explore" if name == "naive_fp4" else "full")) == trained
    weights: dict[int, float] = {}
    for chunk, _ in chunks:
        weights[chunk.micro_batch] = weights.get(chunk.micro_batch, 0.0) + chunk.weight
    assert weights and all(w == pytest.approx(1.0) for w in weights.values())


def hand_advantages(rewards, groups, *, global_std, eps, unbiased, clip=5.0):
    """(r - group mean) / (std + eps), clipped; std over the group or the whole batch."""
    r = [float(x) for x in rewards]
    out = []
    for i, g in enumerate(groups):
        members = [r[j] for j, h in enumerate(groups) if h == g]
        pool = r if global_std else members
        mean_g = sum(members) / len(members)
        mean_p = sum(pool) / len(pool)
        var = sum((x - mean_p) ** 2 for x in pool) / (len(pool) - (1 if unbiased else 0))
        out.append(max(-clip, min(clip, (r[i] - mean_g) / (var**0.5 + eps))))
    return torch.tensor(out)


@pytest.mark.parametrize("name", ["diffusion_nft", "awm", "dance_grpo", "flow_grpo"])
def test_group_methods_take_their_references_advantages(name):
    """NFT, AWM and FlowGRPO: global population std, eps 1e-4; DanceGRPO: per-group n-1 std, eps 1e-8.
    Catches a swapped std pool, estimator or eps."""
    method = make_method(name)
    engine = RecordingEngine()
    batch = method.collect(engine, PROMPT_IDS, PROMPTS, iteration())
    (sample,), (score,) = engine.samples, engine.scores
    dance = name == "dance_grpo"
    expected = hand_advantages(score["rewards"].tolist(), sample["prompt_ids"], global_std=not dance,
                               eps=1e-8 if dance else 1e-4, unbiased=dance)
    if name == "flow_grpo":
        expected = expected[expected != 0]  # FlowGRPO drops zero advantages
    torch.testing.assert_close(batch.data["advantages"].cpu(), expected.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["flow_grpo", "dance_grpo"])
def test_grpo_chunks_pair_each_state_with_its_successor(name):
    """x, x_next and the old log-prob of a chunk are step j and j + 1 of the same sample's trajectory."""
    method = make_method(name)
    engine = RecordingEngine()
    batch, chunks = run_iteration(method, engine)
    xs, log_probs = batch.data["xs"], batch.data["log_probs"]
    for chunk, _ in chunks:
        steps = [chunk.data["j"]] * chunk.data["x"].shape[0] if name == "flow_grpo" else chunk.data["steps"]
        for row, j in enumerate(steps):
            torch.testing.assert_close(chunk.data["x"][row], xs[row, j])
            torch.testing.assert_close(chunk.data["x_next"][row], xs[row, j + 1])
            torch.testing.assert_close(chunk.data["old_log_prob"][row], log_probs[row, j])


@pytest.mark.parametrize("sampler,noise", [("awm_sde", 0.4), ("sa_solver", 0.4), ("euler", 0.0), ("dpm2", 0.0)])
def test_awm_rolls_out_with_its_sampler_and_noise_only_for_the_sa_solver(sampler, noise):
    """Catches AWM's SA-solver losing its tau (or an ODE getting one) and the PickScore setting 0."""
    engine = RecordingEngine()
    make_method("awm", sampler=sampler).collect(engine, PROMPT_IDS, PROMPTS, iteration())
    (sample,) = engine.samples
    assert (sample["kind"], sample["noise_level"]) == (sampler, noise)
    engine = RecordingEngine()
    make_method("awm", noise_level=0.0).collect(engine, PROMPT_IDS, PROMPTS, iteration())
    assert (engine.samples[0]["kind"], engine.samples[0]["noise_level"]) == ("awm_sde", 0.0)


@pytest.mark.parametrize("n_steps,strata,fraction", [(10, 3, 0.9), (14, 6, 0.9), (10, 2, 1.0), (10, 1, 0.5)])
def test_awm_stratified_indices_cover_each_stratum(n_steps, strata, fraction):
    """One index per stratum of [1, int(T * fraction)), every index of a stratum reachable, strata in
    order; catches shifted bounds, a collapsed draw and a wrong clamp (index T - 1 is reachable at
    fraction 1)."""
    from solbench.methods.awm import stratified_indices
    top = max(1, int(n_steps * fraction))
    bounds = torch.linspace(1, top, strata + 1).long()
    seen: set[int] = set()
    g = torch.Generator().manual_seed(0)
    for _ in range(300):
        idx = stratified_indices(n_steps, strata, fraction, g)
        assert idx.shape == (strata,)
        for k, i in enumerate(idx.tolist()):
            assert bounds[k] <= i < max(bounds[k + 1], bounds[k] + 1), (k, i, bounds)
        seen.update(idx.tolist())
    expected = set(range(1, top)) if top > 1 else {1}
    assert seen == expected, (seen, expected)


@pytest.mark.parametrize("name", METHODS)
@pytest.mark.parametrize("guidance,effective", [(1.0, 1.0), (3.0, 3.0), (None, DEFAULT_GUIDANCE)])
def test_rollouts_and_every_loss_forward_use_the_run_guidance(name, guidance, effective):
    """Catches a rollout or a loss forward (v_theta, v_old, v_ref, v_slow) that drops the guidance:
    with the run's 1.0 it would fall back to the model's CFG default."""
    method = make_method(name, guidance=guidance)
    engine = RecordingEngine()
    _, chunks = run_iteration(method, engine)
    assert chunks
    assert [s["guidance"] for s in engine.samples] == [effective] * len(engine.samples)
    rollout_calls = [v for v in engine.velocities if v["context"] != "loss"]
    loss_calls = [v for v in engine.velocities if v["context"] == "loss"]
    assert rollout_calls and {v["guidance"] for v in rollout_calls} == {effective}
    assert {v["net"] for v in loss_calls} == LOSS_NETS[name]
    for net in LOSS_NETS[name]:
        used = {v["guidance"] for v in loss_calls if v["net"] == net}
        assert used == {effective}, f"{name}: loss forwards of {net!r} ran with guidance {used}, run has {effective}"


# -- what is trained ------------------------------------------------------------------------------
def test_sol_rl_regenerates_the_proxy_selection_and_takes_advantages_from_full_rewards():
    """Catches Sol-RL computing advantages from the FP4 proxy rewards, selecting by the full rewards,
    or training on the explore samples instead of the regenerated ones."""
    method = make_method("sol_rl")
    cfg = method.config
    engine = RecordingEngine()
    batch = method.collect(engine, PROMPT_IDS, PROMPTS, iteration())
    explore, full = engine.scores
    assert explore["precision"] == "explore" and full["precision"] == "full"
    chosen = select_per_group(explore["rewards"], cfg.n, cfg.k, cfg.selection, torch.Generator().manual_seed(1))
    regen = engine.samples[1]
    ids = [p for p in PROMPT_IDS for _ in range(cfg.n)]
    assert regen["prompt_ids"] == [ids[i] for i in chosen]
    assert regen["cand_idx"] == [i % cfg.n for i in chosen]  # the same seeds: same prompt id and candidate
    expected = group_advantages(full["rewards"], regen["prompt_ids"], global_std=cfg.global_std, clip=cfg.adv_clip)
    proxy = group_advantages(explore["rewards"][chosen], regen["prompt_ids"], global_std=cfg.global_std,
                             clip=cfg.adv_clip)
    assert not torch.allclose(expected, proxy, atol=1e-3), "the toy rewards must tell the two apart"
    torch.testing.assert_close(batch.data["advantages"], expected)
    # trained samples: the regenerated ones (old policy, full budget), not the explore samples
    regenerated = RecordingEngine().sample(regen["prompt_ids"], [PROMPTS[PROMPT_IDS.index(p)] for p in regen["prompt_ids"]],
                                           regen["cand_idx"], net="old", sampler=method.rollout_spec(),
                                           phase="regenerate", stream="train/1")
    torch.testing.assert_close(batch.data["x0"], regenerated.x0)
    assert [c.precision for c in batch.candidates].count("explore") == cfg.n * len(PROMPT_IDS)
    assert [c.precision for c in batch.candidates].count("full") == cfg.k * len(PROMPT_IDS)
    assert batch.n_images == (cfg.n + cfg.k) * len(PROMPT_IDS)


@pytest.mark.parametrize("name", ["naive_fp4", "naive_scaling"])
def test_naive_controls_train_their_selected_samples_with_their_own_rewards(name):
    """Catches a naive control that regenerates, trains unselected samples or mixes rewards."""
    method = make_method(name)
    cfg = method.config
    engine = RecordingEngine()
    batch = method.collect(engine, PROMPT_IDS, PROMPTS, iteration())
    assert len(engine.samples) == 1 and len(engine.scores) == 1
    rewards = engine.scores[0]["rewards"]
    chosen = select_per_group(rewards, cfg.n, cfg.k, cfg.selection, torch.Generator().manual_seed(1))
    ids = [p for p in PROMPT_IDS for _ in range(cfg.n)]
    expected = group_advantages(rewards[chosen], [ids[i] for i in chosen], global_std=cfg.global_std, clip=cfg.adv_clip)
    torch.testing.assert_close(batch.data["advantages"], expected)
    precision = "explore" if name == "naive_fp4" else "full"
    assert {c.precision for c in batch.candidates} == {precision}
    assert sum(c.selected for c in batch.candidates) == cfg.k * len(PROMPT_IDS)


def test_dance_grpo_shares_one_initial_noise_per_group_and_flow_grpo_does_not():
    """Catches DanceGRPO losing its shared initial noise (or FlowGRPO gaining it by default, or losing
    its same_latent option)."""
    engine = RecordingEngine()
    make_method("dance_grpo").collect(engine, PROMPT_IDS, PROMPTS, iteration())
    make_method("flow_grpo").collect(engine, PROMPT_IDS, PROMPTS, iteration())
    make_method("flow_grpo", same_latent=True).collect(engine, PROMPT_IDS, PROMPTS, iteration())
    dance, flow, flow_same = engine.samples
    assert dance["noise_idx"] == [0] * 8 and dance["cand_idx"] == [0, 1, 2, 3] * 2
    assert flow["noise_idx"] == flow["cand_idx"]
    assert flow_same["noise_idx"] == [0] * 8


def test_dance_grpo_needs_two_steps_and_trains_with_two():
    """It never trains the last step: one step is an error, two train step 0 only."""
    engine = RecordingEngine()
    cls = get_method("dance_grpo")
    config = validate_method_config("dance_grpo", {"group_size": 4})
    with pytest.raises(ValueError, match="at least 2 sampling steps"):
        cls(config, RunInfo(prompts_per_iter=2, steps=1, guidance=1.0)).collect(engine, PROMPT_IDS, PROMPTS, iteration())
    method = cls(config, RunInfo(prompts_per_iter=2, steps=2, guidance=1.0))
    it = iteration()
    chunks = list(method.chunks(method.collect(engine, PROMPT_IDS, PROMPTS, it), it))
    assert [c.data["steps"] for c in chunks] == [[0] * 8]


def test_flow_grpo_kl_variance_per_sampler():
    """sigma_t^2 of the KL: the SDE's step std is sigma_t sqrt(-dt); CPS's std is sigma_t itself."""
    from solbench.methods.flow_grpo import kl_variance

    assert kl_variance("flowgrpo_sde", 0.3, -0.25) == pytest.approx(0.09 / 0.25)
    assert kl_variance("flowgrpo_cps", 0.3, -0.25) == pytest.approx(0.09)


# -- trained timesteps ----------------------------------------------------------------------------
def _per_sample_times(chunks, key="t"):
    """{sample row: [t of every chunk that trains it]} with one micro-batch (rows in order)."""
    times: dict[int, list[float]] = {}
    for chunk, _ in chunks:
        assert chunk.n_micro_batches == 1
        for row, t in enumerate(chunk.data[key].tolist()):
            times.setdefault(row, []).append(round(t, 6))
    return times


def _loss_times_match(chunks, times_of):
    for chunk, calls in chunks:
        expected = times_of(chunk)
        assert calls, "a loss made no velocity call"
        for call in calls:
            torch.testing.assert_close(call["t"], expected)


@pytest.mark.parametrize("name", NFT_FAMILY)
@pytest.mark.parametrize("fraction,n_train", [(1.0, STEPS), (0.5, STEPS // 2), (0.25, 2)])
def test_nft_chunks_train_distinct_nonzero_schedule_points(name, fraction, n_train):
    """Each sample trains int(T * fraction) distinct points of the rollout schedule, never t = 0.
    Catches chunks() drawing from all T + 1 points (t = 0 at fraction 1), ignoring timestep_fraction,
    or a loss evaluating another t than its chunk's."""
    method = make_method(name, timestep_fraction=fraction)
    engine = RecordingEngine()
    batch, chunks = run_iteration(method, engine)
    sigmas = [round(s, 6) for s in engine.adapter.sigmas(STEPS).tolist()]
    times = _per_sample_times(chunks)
    assert len(times) == batch.data["x0"].shape[0]
    for row, ts in times.items():
        assert len(ts) == len(set(ts)) == n_train, (row, ts)
        assert set(ts) <= set(sigmas[:-1]) and 0.0 not in ts
    if fraction == 1.0:
        assert all(set(ts) == set(sigmas[:-1]) for ts in times.values())
    assert sum(chunk.weight for chunk, _ in chunks) == pytest.approx(1.0)
    _loss_times_match(chunks, lambda chunk: chunk.data["t"])


@pytest.mark.parametrize("fraction,n_train", [(0.99, 9), (0.5, 5), (0.3, 3)])
def test_flow_grpo_chunks_train_the_first_steps(fraction, n_train):
    """The first int(T * fraction) SDE steps, each at its own schedule time; catches a fraction that is
    ignored, an off-by-one into the last step, or a loss at another t."""
    method = make_method("flow_grpo", timestep_fraction=fraction)
    engine = RecordingEngine()
    _, chunks = run_iteration(method, engine)
    sigmas = engine.adapter.sigmas(STEPS)
    assert [chunk.data["j"] for chunk, _ in chunks] == list(range(n_train))
    _loss_times_match(chunks, lambda chunk: sigmas[chunk.data["j"]].expand(chunk.data["x"].shape[0]))
    assert all(float(sigmas[chunk.data["j"]]) > 0 for chunk, _ in chunks)


@pytest.mark.parametrize("fraction,n_train", [(0.6, 5), (1.0, 9), (0.3, 2)])
def test_dance_grpo_chunks_train_a_random_subset_without_the_last_step(fraction, n_train):
    """int((T - 1) * fraction) distinct steps per sample out of the first T - 1; catches training
    the last step, ignoring the fraction, or a loss at another t."""
    method = make_method("dance_grpo", timestep_fraction=fraction)
    engine = RecordingEngine()
    batch, chunks = run_iteration(method, engine)
    sigmas = engine.adapter.sigmas(STEPS, method.config.shift)  # DanceGRPO's own shift (3)
    per_sample: dict[int, list[int]] = {}
    for chunk, _ in chunks:
        for row, step in enumerate(chunk.data["steps"]):
            per_sample.setdefault(row, []).append(step)
    assert len(per_sample) == batch.data["xs"].shape[0]
    for steps in per_sample.values():
        assert len(steps) == len(set(steps)) == n_train and max(steps) < STEPS - 1
    _loss_times_match(chunks, lambda chunk: sigmas[torch.tensor(chunk.data["steps"])])


@pytest.mark.parametrize("fraction,top", [(0.9, 9), (0.5, 5)])
def test_awm_chunks_stratify_over_the_fraction_of_the_schedule(fraction, top):
    """train_timesteps distinct points per sample from indices 1 .. int(T * fraction) - 1, one per
    stratum: never t = 1 or t = 0; catches an ignored fraction or a loss at another t."""
    method = make_method("awm", timestep_fraction=fraction, train_timesteps=3)
    engine = RecordingEngine()
    _, chunks = run_iteration(method, engine)
    sigmas = [round(s, 6) for s in engine.adapter.sigmas(STEPS).tolist()]
    allowed = set(sigmas[1:top])
    times = _per_sample_times(chunks)
    assert len(times) == 4 * len(PROMPT_IDS)
    for ts in times.values():
        assert len(ts) == len(set(ts)) == 3 and set(ts) <= allowed, (ts, allowed)
    _loss_times_match(chunks, lambda chunk: chunk.data["t"])


def test_flow_grpo_detaches_the_unconditional_branch_of_its_policy_velocity():
    """Catches (issue 23): FlowGRPO's policy velocity keeping the gradient of CFG's unconditional branch
    (g grad v_c - (g - 1) grad v_u) where the reference detaches it (flow_grpo scripts/train_sd3.py,
    noise_pred_uncond.detach()); the reference role's no-grad velocity has nothing to detach."""
    engine = RecordingEngine()
    run_iteration(make_method("flow_grpo", guidance=4.5, kl_beta=0.01), engine)
    losses = [v for v in engine.velocities if v["context"] == "loss"]
    assert {v["net"] for v in losses} == {"policy", "reference"}
    assert all(v["detach_uncond"] == (v["net"] == "policy") for v in losses)


def _chunk_rows(batch, chunk):
    """The batch rows (positions in batch.data["xs"]) a FlowGRPO chunk holds, found by their states."""
    xs = batch.data["xs"][:, chunk.data["j"]]
    return [int(torch.nonzero((xs == row).all(dim=1))[0]) for row in chunk.data["x"]]


def test_flow_grpo_shuffles_its_samples_before_splitting_them_into_micro_batches():
    """Catches (issue 23): FlowGRPO splitting its samples into micro-batches (and so into its two
    optimizer steps) in prompt order, where the reference shuffles them first (torch.randperm over the
    batch); the permutation comes from the iteration's generator (a resumed run repeats it)."""
    method = make_method("flow_grpo", micro_batch_size=2)
    engine = RecordingEngine()
    it = iteration()
    batch = method.collect(engine, PROMPT_IDS, PROMPTS, it)
    n = batch.data["xs"].shape[0]
    order = []
    for chunk in method.chunks(batch, it):
        if chunk.data["j"] == 0:
            rows = _chunk_rows(batch, chunk)
            order += rows
            torch.testing.assert_close(chunk.data["advantages"], batch.data["advantages"][rows])
            assert chunk.data["prompts"] == [batch.data["prompts"][r] for r in rows]
    assert sorted(order) == list(range(n)) and order != list(range(n))
    again = [r for chunk in method.chunks(batch, iteration()) if chunk.data["j"] == 0 for r in _chunk_rows(batch, chunk)]
    assert again == order


def test_awm_discrete_time_type_starts_its_first_stratum_at_t_1():
    """Catches (issue 23): AWM's PickScore config trains with time_type "discrete" (strata from index
    0, t = 1, train_sd3_awm.py); the strata used to start at index 1 whatever the config."""
    from solbench.methods.awm import stratified_indices

    g = torch.Generator().manual_seed(0)
    firsts = {int(stratified_indices(14, 6, 0.9, g, first=0)[0]) for _ in range(200)}
    assert firsts == {0, 1}  # linspace(0, 12, 7) -> the first stratum is [0, 2)
    method = make_method("awm", time_type="discrete", train_timesteps=6)
    seen = {round(float(chunk.data["t"][0]), 6)
            for seed in range(1, 30)
            for chunk in method.chunks(method.collect(RecordingEngine(), PROMPT_IDS, PROMPTS, iteration(seed)),
                                       iteration(seed))}
    assert 1.0 in seen
