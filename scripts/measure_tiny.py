"""Measure a tiny-model candidate as issue 26's lever table does (docs/embedded-world.md, "At FLUX's coverage").

One command for every number of a row of that table, so a candidate is judged the same way each time:

- ranking fidelity (``solbench.fidelity.experiment``, the code `solbench fidelity` runs): 16 seeds per prompt, 6 explore
  steps against 10 full-precision steps, sigma shift 3, run seed 0, rewards shapes_geneval and shapes_clip, on
  the held-out 16 (the issue's bar), the tuning split shapes/eval 33 and the fresh grammar draw shapes/draw26 30,
  for each explore recipe (default: the FLUX analogue, the SANA analogue and the step-budget-only control);
  per set the mean per-prompt Spearman rho, and pooled over the 79 prompts with a 95 % normal interval;
- strict held-out accuracy (``solbench.measure.tiny_accuracy.evaluate``: the eval noise stream, 10 Euler steps,
  shift 3) unguided and at each CFG scale, overall and the weakest skill.

    python scripts/measure_tiny.py --model-path build/tiny_rD --out build/tiny_rD/measure.json

Fidelity runs go to --workdir (default: a folder beside --out), so results/ is left alone; a rerun reuses the
runs that are done. The output JSON holds every number; the last line printed is the table row.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

#: (prompt set, prompts): the held-out bar, the tuning split, the fresh draw (docs/embedded-world.md)
SETS = (("shapes/heldout", 16), ("shapes/eval", 33), ("shapes/draw26", 30))
REWARDS = ("shapes_geneval", "shapes_clip")


def pooled(values: list[float]) -> dict:
    """Mean of per-prompt values with a 95 % normal interval (1.96 standard errors)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else float("nan")
    return {"mean": round(mean, 4), "half_width": round(1.96 * sd / math.sqrt(n), 4), "prompts": n}


def parse_sets(text: str) -> tuple[tuple[str, int], ...]:
    """``SET:N,SET:N`` -> ((set, n), ...)."""
    out = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, _, n = item.rpartition(":")
        if not name or not n.isdigit() or int(n) < 1:
            raise SystemExit(f"error: --sets {text!r}: {item!r} is not SET:N (a prompt set and a prompt count)")
        out.append((name, int(n)))
    return tuple(out)


def measure_fidelity(model_path: str, recipes: list[str], workdir: Path, run_seed: int, sets=SETS,
                     echo=print) -> dict:
    import pandas as pd

    from solbench.fidelity.experiment import FidelitySettings, run
    from solbench.report.fidelity import group_fidelity, pair_candidates
    from solbench.results import RunStore

    out: dict = {}
    for recipe in recipes:
        per_reward: dict[str, list[float]] = {r: [] for r in REWARDS}
        by_set: dict = {}
        share = None
        for prompts, n in sets:
            settings = FidelitySettings(name="measure_tiny", model="tiny", model_path=model_path, prompts=prompts,
                                        n_prompts=n, seeds=16, shift=3.0, recipe=recipe, rewards=list(REWARDS),
                                        run_seed=run_seed, device="cpu")
            spec, run_dir = run(settings, workdir, echo=echo)
            q = spec["quant"]
            if q.get("linears"):
                share = {"quantized_linears": q["quantized_linears"], "linears": q["linears"],
                         "mac_share": round(float(q["mac_share"]), 4)}
            frame = pd.DataFrame(RunStore(run_dir, run_dir.name).read("candidates"))
            groups = group_fidelity(pair_candidates(frame), (4,))
            by_set[prompts] = {}
            for reward in REWARDS:
                rho = groups.loc[groups["reward_name"] == reward, "spearman_rho"].astype(float).tolist()
                per_reward[reward] += rho
                by_set[prompts][reward] = round(sum(rho) / len(rho), 4)
        out[recipe] = {"sets": by_set, "pooled": {r: pooled(v) for r, v in per_reward.items()}, "coverage": share}
    return out


def measure_accuracy(model_path: str, seeds: int, guidances: list[float | None]) -> dict:
    from solbench.models.tiny import load_tiny
    from solbench.measure.tiny_accuracy import evaluate

    model = load_tiny(folder=Path(model_path))
    result = evaluate(model, "shapes/heldout", seeds=seeds, steps=10, guidances=tuple(guidances), shift=3.0)
    out = {}
    for key, r in result["by_guidance"].items():
        weakest = min(r["per_skill"].items(), key=lambda kv: kv[1]["strict"])
        out[key] = {"accuracy": r["accuracy"], "weakest_skill": weakest[0], "weakest": weakest[1]["strict"],
                    "per_skill": {k: v["strict"] for k, v in r["per_skill"].items()}}
    return out


def table_row(name: str, fidelity: dict, accuracy: dict, sets=SETS) -> str:
    flux = fidelity.get("nvfp4_tiny_flux")
    cells = [name]
    if flux:
        g = [flux["sets"][p]["shapes_geneval"] for p, _ in sets]
        c = [flux["sets"][p]["shapes_clip"] for p, _ in sets]
        cells.append(" / ".join(f"{v:.3f}" for v in g) + f" (pooled {flux['pooled']['shapes_geneval']['mean']:.3f}"
                     f" +- {flux['pooled']['shapes_geneval']['half_width']:.3f})")
        cells.append(" / ".join(f"{v:.3f}" for v in c))
    if "none" in fidelity:
        cells.append(" / ".join(f"{fidelity['none']['sets'][p]['shapes_geneval']:.3f}" for p, _ in sets))
    cells.append(" / ".join(f"{k} {v['accuracy']:.3f} (min {v['weakest_skill']} {v['weakest']:.3f})"
                            for k, v in accuracy.items()))
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="folder with tiny_t2i.safetensors and tiny_t2i.json")
    p.add_argument("--out", required=True, help="JSON file for every number")
    p.add_argument("--workdir", default=None, help="results root of the fidelity runs (default: <out>.runs/)")
    p.add_argument("--recipes", default="nvfp4_tiny_flux,nvfp4_tiny,none")
    p.add_argument("--sets", default=",".join(f"{s}:{n}" for s, n in SETS),
                   help="prompt sets and counts of the fidelity runs, SET:N,... (default: the table's three)")
    p.add_argument("--run-seed", type=int, default=0)
    p.add_argument("--accuracy-seeds", type=int, default=8, help="seeds per held-out prompt (default 8)")
    p.add_argument("--guidances", default="none,3,6", help="CFG scales of the accuracy ('none': unguided)")
    p.add_argument("--skip-fidelity", action="store_true")
    p.add_argument("--skip-accuracy", action="store_true")
    args = p.parse_args(argv)

    folder = Path(args.model_path)
    if not (folder / "tiny_t2i.safetensors").is_file():
        print(f"error: --model-path {folder}: no tiny_t2i.safetensors there", file=sys.stderr)
        return 2
    guidances = [None if g.strip() == "none" else float(g) for g in args.guidances.split(",") if g.strip()]
    out_path = Path(args.out)
    workdir = Path(args.workdir) if args.workdir else out_path.with_suffix(".runs")
    t0 = time.perf_counter()
    sets = parse_sets(args.sets)
    result: dict = {"model_path": str(folder), "run_seed": args.run_seed, "sets": [list(s) for s in sets]}
    if not args.skip_fidelity:
        recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
        result["fidelity"] = measure_fidelity(str(folder), recipes, workdir, args.run_seed, sets)
    if not args.skip_accuracy:
        result["accuracy"] = {"prompt_set": "shapes/heldout", "seeds": args.accuracy_seeds, "steps": 10,
                              "shift": 3.0, **measure_accuracy(str(folder), args.accuracy_seeds, guidances)}
    result["seconds"] = round(time.perf_counter() - t0, 1)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1))
    accuracy = {k: v for k, v in result.get("accuracy", {}).items() if isinstance(v, dict)}
    print(json.dumps(result, indent=1))
    print(table_row(folder.name, result.get("fidelity", {}), accuracy, sets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
