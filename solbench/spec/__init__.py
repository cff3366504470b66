"""Experiment specs: YAML files that expand into validated, fully resolved RunConfigs.

A spec names an experiment and describes its runs::

    name: flux_main                  # results/<name>/, reports/<name>/
    description: ...
    launch: local                    # a profile in slurm/profiles/ (local, debug, gpu, ...) or a path
    base:                            # RunConfig fields shared by every run (nested sections merge)
      model: {name: flux}
      rewards: {imagereward: 1.0}
      iterations: 300
      eval: {every: 20, prompts: ..., rewards: [...]}
    matrix:                          # lists expand to a Cartesian product
      method: [sol_rl, diffusion_nft]
      seed: [0, 1]
      n: [48, 96]                    # a method axis: only methods declaring "n" vary over it
    include: [{method: naive_fp4, n: 96, k: 24}]   # extra combinations (missing keys range over the matrix)
    exclude: [{method: diffusion_nft, seed: 1}]    # remove matrix combinations matching every given key
    methods:                         # per-method overrides (RunConfig fields, method_config)
      diffusion_nft: {method_config: {group_size: 24}}
    sweep: {...}                     # optional Optuna study over axes (solbench.sweep)

Matrix keys are ``method``, ``model`` (short for ``model.name``), any RunConfig field (``seed``,
``prompts_per_iter``) or dotted path (``finetune.lr``, ``sampling.steps``), or a method axis: a
field of a method's Config listed in its ``axes`` (``n``, ``k``, ``explore_steps``, ``selection``,
``group_size``, ...). A method axis is dropped for methods that do not declare it, and combinations
that then coincide collapse to one run (flow_grpo does not run once per K); an axis that no listed
method declares is an error.

Precedence, lowest first: RunConfig defaults < ``base`` < ``methods.<method>`` < matrix/include values.

Everything is checked before anything runs: unknown keys, wrong types, NaN/inf numbers, numbers out of
range (a learning rate <= 0, a negative weight decay: ``models.FIELD_BOUNDS``; counts below 1), unknown
methods, models, rewards, quantization recipes and prompt sets, prompts_per_iter or eval.n_prompts
larger than their prompt set, a tiny model path that is neither pretrained nor random, K > N, more
explore steps than sampling.steps, batch arithmetic that does not divide, and the ``fidelity:`` block. Errors are ConfigError naming the file, the line, the key path and
the allowed values. (Prompt files given as paths are checked when the run is launched if they are
not on the expanding machine.)

The run id is ``RunConfig.run_id``: a short hash of the resolved run (launch fields are not part of
RunConfig, so moving a spec from a laptop to a cluster keeps its run ids and results).

One job a module (this __init__ only re-exports their names):

- yaml_lines.py: YAML loading with the line of every key (``load_yaml``);
- models.py: the pydantic schema of specs and launch profiles, and how its errors read;
- registries.py: the models, rewards, recipes and prompt sets a spec is checked against;
- plan.py: the expanded spec (``ExperimentSpec``, ``PlannedRun``) and ``runs_table``;
- resolver.py: the expansion of a spec into resolved, checked runs (fidelity_block.py: the ``fidelity:`` block,
  speed_block.py: the ``speed:`` block);
- fidelity_plan.py: which checkpoints a ``fidelity:`` block measures (solbench.fidelity runs them);
- speed_arms.py: the arms of a ``speed:`` block, each a method's main run (solbench.speed times them);
- load.py: ``load_spec``, reading, validating and expanding a spec file;
- profiles.py: launch profiles (``load_profile``, ``check_launch``).

Stage ``spec`` (solbench/stages.py): it imports its own modules and the stages below it, train, method, engine,
rewards, models, quant, world, report, results, machine, text, base.
"""

from solbench.spec.load import load_spec
from solbench.spec.models import (NAME_PATTERN, FidelityBlock, ProfileModel, RunOverrides, SpecModel, SweepModel,
                                  SweepObjective, SweepParam, SweepPruner)
from solbench.spec.plan import ExperimentSpec, PlannedRun, runs_table
from solbench.spec.profiles import check_launch, load_profile, profile_search_path
from solbench.spec.registries import Registries, is_prompt_path
from solbench.spec.resolver import _is_run_path
from solbench.spec.yaml_lines import load_yaml

__all__ = [
    "NAME_PATTERN", "ExperimentSpec", "FidelityBlock", "PlannedRun", "ProfileModel", "Registries", "RunOverrides",
    "SpecModel", "SweepModel", "SweepObjective", "SweepParam", "SweepPruner", "_is_run_path", "check_launch",
    "is_prompt_path", "load_profile", "load_spec", "load_yaml", "profile_search_path", "runs_table",
]
