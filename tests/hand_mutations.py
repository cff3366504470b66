"""Hand-applied mutations of the methods: each must make the fast method tests fail.

Run:  .venv/bin/python tests/hand_mutations.py   (about 20 x 7 s on one core)

Works on a copy of the repository (never the working tree): each mutation is applied to the copy, the
fast method tests run against it (``solbench`` and ``solbench.methods`` imported from the copy through
PYTHONPATH), and the copy is restored. Prints one line per mutation, KILLED (with the first failing
test) or SURVIVED; exits 1 if any survived. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAST_TESTS = ["tests/test_methods_wiring.py", "tests/test_methods_math.py", "tests/test_methods_registry.py"]

# (what the bug is, file, original text, mutated text)
MUTS = [
 ("sol_rl: advantages from FP4 proxy rewards", "methods/sol_rl.py",
  "batch = self.training_batch(engine, full, rewards, candidates", "batch = self.training_batch(engine, full, proxy[chosen], candidates"),
 ("sol_rl: trains the explore samples", "methods/sol_rl.py",
  "batch = self.training_batch(engine, full, rewards, candidates", "batch = self.training_batch(engine, explore.index(chosen), rewards, candidates"),
 ("sol_rl: explores with the full step budget", "methods/sol_rl.py",
  "sampler=self.rollout_spec(cfg.explore_steps)", "sampler=self.rollout_spec()"),
 ("sol_rl: regenerates with the explore copy", "methods/sol_rl.py",
  "net=self.rollout_net, sampler=self.rollout_spec(), phase=\"regenerate\"", "net=\"explore\", sampler=self.rollout_spec(), phase=\"regenerate\""),
 ("naive_fp4: explores at full precision", "methods/naive_fp4.py",
  'net="explore", sampler=self.rollout_spec()', 'net=self.rollout_net, sampler=self.rollout_spec()'),
 ("diffusion_nft: rollouts from policy instead of old", "methods/diffusion_nft.py",
  '    rollout_net = "old"', '    rollout_net = "policy"'),
 ("nft chunks: t=0 included", "methods/diffusion_nft.py",
  "n_samples, n_points = x0.shape[0], len(sigmas) - 1", "n_samples, n_points = x0.shape[0], len(sigmas)"),
 ("nft chunks: timestep_fraction ignored", "methods/diffusion_nft.py",
  "n_train = max(1, int(n_points * self.config.timestep_fraction))", "n_train = n_points"),
 ("nft loss: guidance dropped in v_theta", "methods/diffusion_nft.py",
  'v = engine.velocity("policy", x_t, t, cond, guidance).float()', 'v = engine.velocity("policy", x_t, t, cond).float()'),
 ("nft loss: guidance dropped in v_old", "methods/diffusion_nft.py",
  'v_old = engine.velocity("old", x_t, t, cond, guidance).float()', 'v_old = engine.velocity("old", x_t, t, cond).float()'),
 ("nft loss: guidance dropped in v_ref", "methods/diffusion_nft.py",
  'kl = velocity_deviation(engine, "reference", v, x_t, t, cond, guidance)', 'kl = velocity_deviation(engine, "reference", v, x_t, t, cond, None)'),
 ("nft rollout: guidance dropped", "methods/diffusion_nft.py",
  "guidance=self.run.guidance,\n", "guidance=None,\n"),
 ("awm loss: guidance dropped in v_slow", "methods/awm.py",
  'kl_slow = velocity_deviation(engine, "old", v, x_t, t, cond, guidance)', 'kl_slow = velocity_deviation(engine, "old", v, x_t, t, cond, None)'),
 ("awm loss: guidance dropped in v_theta", "methods/awm.py",
  'v = engine.velocity("policy", x_t, t, cond, guidance).float()', 'v = engine.velocity("policy", x_t, t, cond).float()'),
 ("awm chunks: timestep_fraction ignored", "methods/awm.py",
  "cfg.train_timesteps, cfg.timestep_fraction, it.generator)", "cfg.train_timesteps, 1.0, it.generator)"),
 ("flow_grpo loss: guidance dropped in v_ref", "methods/flow_grpo.py",
  'v_ref = engine.velocity("reference", x, t, cond, chunk.data["guidance"])', 'v_ref = engine.velocity("reference", x, t, cond)'),
 ("flow_grpo chunks: timestep_fraction ignored", "methods/flow_grpo.py",
  "n_train = max(1, int(n_steps * self.config.timestep_fraction))", "n_train = n_steps"),
 ("dance_grpo chunks: trains the last step", "methods/dance_grpo.py",
  "n_candidates = n_steps - 1  # the last step is never trained", "n_candidates = n_steps"),
 ("dance_grpo chunks: timestep_fraction ignored", "methods/dance_grpo.py",
  "n_train = max(1, int(n_candidates * self.config.timestep_fraction))", "n_train = n_candidates"),
 ("dance_grpo loss: guidance dropped", "methods/dance_grpo.py",
  'v = engine.velocity("policy", x, t, cond, chunk.data["guidance"])', 'v = engine.velocity("policy", x, t, cond)'),
]



def main() -> int:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", ".git", "results", "reports", "__pycache__",
                                                                    "mutants", ".mutmut-cache"))
        (copy / "solbench" / "methods").symlink_to(Path("..") / "methods")  # what the editable install maps
        env = {**os.environ, "PYTHONPATH": str(copy), "OMP_NUM_THREADS": "1"}
        for label, path, old, new in MUTS:
            target = copy / path
            src = target.read_text()
            if src.count(old) != 1:
                results.append((label, f"NOT APPLIED (found {src.count(old)}x)"))
                continue
            target.write_text(src.replace(old, new))
            try:
                r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *FAST_TESTS],
                                   cwd=copy, capture_output=True, text=True, env=env, timeout=600)
            finally:
                target.write_text(src)
            failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
            results.append((label, f"KILLED by {failed[0].split(' ')[1].split('::')[-1]}" if r.returncode
                            else "SURVIVED"))
    for label, result in results:
        print(f"{label:55s} {result}")
    return 0 if all(r.startswith("KILLED") for _, r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
