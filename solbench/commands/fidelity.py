"""`solbench fidelity`: ranking fidelity as a standalone experiment (the unbiased Table 8).

Samples M prompts x N seeds from one fixed checkpoint (a run's latest checkpoint, or the base model)
at both precisions, with no training: the explore copy (low precision, ``--explore-steps``) and the
full-precision network (``--steps``) from the same candidate noise, every image scored by every
reward. Writes results/<name>/<run_id>/ (the run) and the collected parquet tables, then
reports/<name>/ with the ranking-fidelity section (Kendall tau, Spearman rho, top-K hit rates,
contrastive overlap over all N seeds). Runs with other settings under the same --name are kept and
reported side by side (e.g. --explore-steps 6 and 10, or --recipe none for the step-count effect
alone). The logic lives in solbench.fidelity.experiment.
"""

from __future__ import annotations

import argparse

from solbench.commands._common import add_reports_argument, add_results_argument, bounded_int, finite_float, name_value

HELP = "rank M prompts x N seeds at both precisions from a fixed checkpoint (no training), then report fidelity"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from solbench.models import DEFAULT_EXPLORE_RECIPES
    from solbench.fidelity.experiment import NO_QUANT
    from solbench.spec.models import SEED_LIMIT
    from solbench.machine.threads import MAX_THREADS

    parser.add_argument("--model", default=None, help="tiny | flux | sd3 | sana (default: the checkpoint's, else tiny)")
    parser.add_argument("--model-path", default=None,
                        help="local folder or Hugging Face id of the weights (default: the model's / the run's)")
    parser.add_argument("--resolution", type=int, default=None, help="image side in pixels (default: the model's)")
    parser.add_argument("--checkpoint", default=None, metavar="RUN_DIR|FILE",
                        help="results/<experiment>/<run_id> (its latest checkpoint) or a checkpoint file in a run "
                             "folder; default: the base model")
    parser.add_argument("--role", default="policy", choices=("policy", "ema", "old"),
                        help="which of the checkpoint's networks to measure (default policy)")
    parser.add_argument("--prompts", default=None,
                        help="prompt set name or .txt/.jsonl file (default: the run's eval set, else shapes/eval)")
    parser.add_argument("--n-prompts", type=int, default=16, metavar="M", help="first M prompts of the set (default 16)")
    parser.add_argument("--seeds", type=int, default=32, metavar="N", help="seeds per prompt (default 32)")
    parser.add_argument("--steps", type=int, default=10, help="full-precision sampling steps (default 10)")
    parser.add_argument("--explore-steps", type=int, default=6, help="low-precision explore steps (default 6)")
    parser.add_argument("--sampler", default=None,
                        help="ODE solver of both stages: dpm2 | euler (default: the run's method's, else Sol-RL's dpm2)")
    parser.add_argument("--guidance", type=finite_float, default=None, help="CFG / distilled guidance (default: the run's or model's)")
    parser.add_argument("--shift", type=finite_float, default=None, help="sigma-schedule shift (default: the run's or model's)")
    defaults = ", ".join(f"{m}: {r}" for m, r in DEFAULT_EXPLORE_RECIPES.items())
    parser.add_argument("--recipe", default=None,
                        help=f"explore quantization recipe (default: the run's, else per model: {defaults}); "
                             f"'{NO_QUANT}' explores in full precision (step-count effect alone)")
    parser.add_argument("--recipes", default=None, metavar="R1,R2,...",
                        help="one run per explore recipe under one --name, reported side by side with the "
                             f"decomposition (e.g. nvfp4_tiny,{NO_QUANT},mxfp4_w4a4,fp8_w8a8: '{NO_QUANT}' is the "
                             "step-budget-only control); overrides --recipe")
    parser.add_argument("--backend", default=None, choices=("emulated", "te", "torch", "cpu_bf16", "auto"),
                        help="quantization backend (default: the run's; else emulated on CPU, te on CUDA)")
    parser.add_argument("--rewards", default=None,
                        help="comma-separated reward names (default: the run's training rewards, else shapes_geneval)")
    parser.add_argument("--name", type=name_value, default=None,
                        help="experiment name, a folder under --results (default fidelity_<model>)")
    parser.add_argument("--run-seed", type=bounded_int(0, SEED_LIMIT, "a run seed, as a spec's seed"), default=0,
                        help="run seed the candidate noise derives from (default 0)")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda (default auto)")
    parser.add_argument("--batch-seeds", type=int, default=None,
                        help="seeds per sampling call (memory bound; default all of a prompt's seeds)")
    parser.add_argument("--threads", type=bounded_int(1, MAX_THREADS + 1, "no CPU has more cores"), default=None,
                        metavar="N",
                        help="CPU threads the run computes on, part of its id as numerics.threads is a training run's "
                             "(default: the checkpoint run's, else 1)")
    add_results_argument(parser)
    add_reports_argument(parser)
    parser.add_argument("--force", action="store_true", help="rerun a fidelity run that is done already")
    parser.add_argument("--no-report", action="store_true", help="do not collect nor write the report")


def main(args: argparse.Namespace) -> int:
    from pathlib import Path

    import pandas as pd

    from solbench.fidelity.experiment import FidelitySettings, check_recipe, run, summary

    import dataclasses

    echo = print
    settings = FidelitySettings(
        name=args.name, model=args.model, model_path=args.model_path, resolution=args.resolution,
        checkpoint=args.checkpoint, role=args.role, prompts=args.prompts, n_prompts=args.n_prompts, seeds=args.seeds,
        steps=args.steps, explore_steps=args.explore_steps, sampler=args.sampler, guidance=args.guidance,
        shift=args.shift, recipe=args.recipe, backend=args.backend,
        rewards=[r.strip() for r in (args.rewards or "").split(",") if r.strip()], run_seed=args.run_seed,
        device=args.device, batch_seeds=args.batch_seeds, threads=args.threads)
    recipes = [r.strip() for r in (args.recipes or "").split(",") if r.strip()] or [settings.recipe]
    for recipe in recipes:  # every recipe before any work: not a traceback after the first one has run
        check_recipe(recipe, "--recipes" if args.recipes else "--recipe")
    from solbench.results import RunStore

    for recipe in recipes:
        spec, run_dir = run(dataclasses.replace(settings, recipe=recipe), args.results, force=args.force, echo=echo)
        frame = pd.DataFrame(RunStore(run_dir, run_dir.name).read("candidates"))
        table = summary(frame)
        s, q = spec["sampling"], spec["quant"]
        share = "" if not q.get("linears") else (
            f" ({q['quantized_linears']} of {q['linears']} Linears, {100 * q['mac_share']:.1f}% of linear MACs in low precision)")
        echo(f"{spec['model']['name']} {q['recipe']}{share} {s['sampler']} {s['explore_steps']} explore steps vs "
             f"full precision {s['steps']} steps; {frame['prompt_id'].nunique()} prompts x {spec['seeds']} seeds "
             "(mean over prompts):")
        for _, row in table.iterrows():
            metrics = "  ".join(f"{c} {row[c]:.3f}" for c in table.columns
                                if c in ("kendall_tau", "spearman_rho") or c.startswith("hit@"))
            echo(f"  {row.get('reward_name', 'reward')}: {metrics}")
    if args.no_report:
        return 0
    from solbench.commands.collect import print_collect
    from solbench.report import ReportOptions, write_report
    from solbench.collect import collect

    experiment_dir = Path(args.results) / spec["experiment"]
    print_collect(collect(experiment_dir))
    index = write_report(experiment_dir, args.results, args.reports,
                         options=ReportOptions(kinds=("ranking_fidelity",)))
    echo(f"report: {index}")
    return 0
