"""Provenance tables: where every setting of a real spec comes from, checked against the expanded spec.

A real spec (experiments/flux_main.yaml, ...) has a table beside it, experiments/provenance/<spec
name>.yaml, with one row per setting its runs have::

    references:                     # short name -> repository and the commit read
      sana: {repo: NVlabs/Sana, commit: 6926be6..., read: "meefs/Sana (a mirror) at that commit"}
    rows:
      - setting: finetune.grad_clip  # a resolved setting (settings.SETTINGS or a dotted RunConfig path)
        methods: [sol_rl, naive_scaling, naive_fp4, diffusion_nft]   # or "all"
        value: 0.002                 # the reference's value
        ref: sana                    # a key of references
        file: configs/sol_rl/base.py
        at: "get_config: train.max_grad_norm = 0.002"   # the line, or the config key
      - setting: finetune.lora_rank
        methods: [flow_grpo]
        value: 64
        ref: flow_grpo
        file: scripts/train_flux.py
        at: "LoraConfig(r=64, lora_alpha=128)"
        solbench: 32                  # what the spec resolves to instead ...
        deviation: the paper's shared setting, every method at LoRA r=32 alpha=64   # ... and why

``check(spec_path)`` expands the spec and compares, for every run, every row of its method: the resolved
value equals the row's ``value``, or, for a deviation, its ``solbench`` value (which must differ from
``value``, and carry a one-line reason). Which settings need a row is ENUMERATED from the resolved runs
(settings.run_settings: every RunConfig leaf and method_config field, less those that change no number,
each with why, plus the derived settings), so a table cannot lose a row, nor a new setting go without one,
unnoticed. The evaluation protocol (settings.PROTOCOL: guidance, resolution, steps, sampler, shift, prompts,
seeds, rewards) must be one per spec, whatever each method trains with. The spec's header comment lists every
deviation (``header_block`` writes that list) and the report shows them (solbench.report.provenance).

``python -m solbench.provenance check SPEC`` prints the problems; ``... header SPEC`` the header block.

Stage ``spec`` (solbench/stages.py): it imports its own modules and the stages below it, train, method, engine,
rewards, models, quant, world, report, results, machine, text, base.
"""

from __future__ import annotations

from solbench.provenance.check import Resolved, check, header_block, protocol_problems, table_problems
from solbench.provenance.settings import (COVERED, NOT_RESULTS, PROTOCOL, SETTINGS, optimizer_steps_per_iteration,
                                          resolve, run_settings, same)
from solbench.provenance.table import Row, Table, find_table, load_table, table_path

__all__ = ["COVERED", "NOT_RESULTS", "PROTOCOL", "SETTINGS", "Resolved", "Row", "Table", "check", "find_table",
           "header_block", "load_table", "optimizer_steps_per_iteration", "protocol_problems", "resolve",
           "run_settings", "same", "table_path", "table_problems"]
