"""The provenance tables of the real specs (experiments/provenance/<spec>.yaml, solbench.provenance).

Every setting of a real run has a row (repository, file, line or config key, value), the settings being
enumerated from the resolved runs (every RunConfig leaf and method_config field that changes a number);
the spec, expanded, must resolve to each row's value, or to its `solbench` value where the row declares a
deviation with a one-line reason; the spec's header and the report list the deviations; the evaluation
protocol is one per spec. Changing a value on either side, a reason, dropping any row, adding a setting
without one, or evaluating one method otherwise fails.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from solbench.errors import ConfigError
from solbench.provenance import settings
from solbench.provenance import (Resolved, check, header_block, load_table, protocol_problems, table_path,
                                 table_problems)
from solbench.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ["flux_main", "sd35_main", "sana_main"]


@pytest.mark.parametrize("name", SPECS)
def test_every_real_spec_matches_its_provenance_table(name):
    """Catches (issue 23): a real spec whose settings drift from the references with nobody noticing;
    before the tables SANA, SD3.5's recipe, clip and fraction, text lengths, LoRA init, DanceGRPO's steps
    and AWM's settings differed undeclared."""
    assert check(ROOT / "experiments" / f"{name}.yaml") == []


def _copy(tmp_path, name):
    spec = tmp_path / f"{name}.yaml"
    shutil.copy(ROOT / "experiments" / f"{name}.yaml", spec)
    (tmp_path / "provenance").mkdir()
    shutil.copy(table_path(ROOT / "experiments" / "x.yaml", name), tmp_path / "provenance" / f"{name}.yaml")
    return spec, tmp_path / "provenance" / f"{name}.yaml"


def test_a_spec_value_changed_without_its_row_fails(tmp_path):
    spec, _ = _copy(tmp_path, "sd35_main")
    spec.write_text(spec.read_text().replace("grad_clip: 0.002", "grad_clip: 1.0", 1))
    problems = check(spec)
    assert problems and all("finetune.grad_clip" in p for p in problems)
    assert any("resolves to 1.0, not the reference's 0.002 (sana configs/sol_rl/base.py" in p for p in problems)


def test_a_table_value_changed_without_the_spec_fails(tmp_path):
    spec, table = _copy(tmp_path, "flux_main")
    table.write_text(table.read_text().replace("value: 0.4, ref: sana", "value: 0.6, ref: sana", 1))
    problems = check(spec)
    assert problems and all("method_config.timestep_fraction" in p and "0.6" in p for p in problems)


def test_a_deviation_must_be_in_the_spec_header(tmp_path):
    spec, table = _copy(tmp_path, "sana_main")
    text = table.read_text()
    table.write_text(text.replace("deviation: \"the paper's 8 GPUs per run\"", "deviation: \"eight GPUs\"", 1))
    problems = check(spec)
    assert len(problems) == 2 and all("its header does not list the deviation" in p for p in problems)
    assert any("'- eight GPUs: world_size [flow_grpo]'" in p for p in problems)


def test_a_dropped_row_fails(tmp_path):
    spec, table = _copy(tmp_path, "flux_main")
    lines = [line for line in table.read_text().splitlines() if "setting: finetune.ema_every, methods: [awm]" not in line]
    table.write_text("\n".join(lines) + "\n")
    assert check(spec) == [f"{table}: awm has no row for finetune.ema_every"]


@pytest.mark.parametrize("name", SPECS)
def test_deleting_any_single_row_fails_the_check(name):
    """Catches (issue 41): rows that could be deleted with no test failing (explore_steps, selection, beta,
    loss_scale, noise_level, eta, shift, shared_noise, time_type, advantage_max, slow_beta, checkpoint,
    prompt_instruction, min_dim_exempt were outside the old REQUIRED list): which settings need a row is
    enumerated from the runs, so every row of every table is needed by some run. Each row is deleted in turn
    (the table as loaded; the values are resolved once)."""
    spec_path = ROOT / "experiments" / f"{name}.yaml"
    resolved = Resolved(load_spec(spec_path))
    table = load_table(table_path(spec_path, name), resolved.methods)
    assert table_problems(spec_path, table, resolved) == []
    survivors = []
    for index, row in enumerate(table.rows):
        without = dataclasses.replace(table, rows=table.rows[:index] + table.rows[index + 1:])
        problems = table_problems(spec_path, without, resolved)
        if not any(f"has no row for" in p and row.setting in p for p in problems):
            survivors.append(f"line {row.line}: {row.setting} [{', '.join(row.methods)}]")
    assert survivors == [], survivors
    assert len(table.rows) > 150


def test_a_setting_no_row_holds_fails(monkeypatch):
    """Catches a setting the harness knows going without a row: were model.cpu_offload a setting that
    changes numbers (not in NOT_RESULTS), every method of the spec would need a row for it."""
    spec_path = ROOT / "experiments" / "sd35_main.yaml"
    monkeypatch.delitem(settings.NOT_RESULTS, "model.cpu_offload")
    resolved = Resolved(load_spec(spec_path))
    problems = table_problems(spec_path, load_table(table_path(spec_path, "sd35_main"), resolved.methods), resolved)
    assert problems == [f"{table_path(spec_path, 'sd35_main')}: {m} has no row for model.cpu_offload" for m in resolved.methods]


def test_the_enumeration_names_only_real_settings():
    """Every path NOT_RESULTS exempts or COVERED replaces is a leaf of a real run (a renamed field would
    otherwise stop being asked for silently), and every setting COVERED points to is a derived one."""
    spec = load_spec(ROOT / "experiments" / "sana_main.yaml")
    leaves = {leaf for run in spec.runs for leaf in settings._leaves(run.config, "")}
    assert set(settings.NOT_RESULTS) | set(settings.COVERED) <= leaves
    assert {s for targets in settings.COVERED.values() for s in targets} <= set(settings.SETTINGS)


@pytest.mark.parametrize("name,edit,setting", [
    # unset, each method is evaluated at its own training resolution: FlowGRPO and AWM at 512 px on SD3.5
    ("sd35_main", ("    resolution: 1024\n    sampler: dpm2", "    sampler: dpm2"), "derived.eval_resolution"),
    # one method's own evaluation guidance
    ("flux_main", ("    eval: {use_ema: false}", "    eval: {use_ema: false, guidance: 3.5}"), "derived.eval_guidance"),
    # one method's own evaluation steps
    ("sana_main", ("    sampling: {steps: 14}", "    sampling: {steps: 14, eval_steps: 28}"), "sampling.eval_steps"),
])
def test_an_evaluation_setting_that_differs_between_methods_fails(tmp_path, name, edit, setting):
    """Catches (issue 41): Table 1 columns measured differently (SANA and SD3.5 baselines evaluated at CFG 4.5
    against Sol-RL's 1.0, FLUX's FlowGRPO at distilled 3.5, SD3.5's FlowGRPO and AWM at 512 px): the check
    fails whenever one method of a spec is evaluated otherwise, whatever its rows say."""
    spec, _ = _copy(tmp_path, name)
    text = spec.read_text()
    assert text.count(edit[0]) == 1
    spec.write_text(text.replace(*edit))
    problems = check(spec)
    protocol = [p for p in problems if "the evaluation protocol differs between methods" in p]
    assert len(protocol) == 1 and f": {setting} is " in protocol[0], problems
    assert protocol == protocol_problems(spec, Resolved(load_spec(spec)))


def test_the_eval_sampler_row_is_computed_from_the_spec(tmp_path):
    """Catches (issue 41): derived.eval_sampler resolved to the constant "euler", so its row could not fail."""
    spec, _ = _copy(tmp_path, "flux_main")
    text = spec.read_text()
    spec.write_text(text.replace("    sampler: dpm2\n", "    sampler: euler\n", 1))
    problems = check(spec)
    assert problems and all("derived.eval_sampler" in p for p in problems), problems
    assert any("resolves to 'euler', not the reference's 'dpm2' (sana configs/sol_rl/flux1.py" in p for p in problems)


@pytest.mark.parametrize("edit,message", [
    (("value: 1024, ref: sana, file: configs/sol_rl/sana.py", "value: 1024, ref: nowhere, file: configs/sol_rl/sana.py"),
     "ref 'nowhere' is not one of references"),
    (("setting: model.resolution, methods: *nft", "setting: model.resolutoin, methods: *nft"), "unknown setting"),
    (("solbench: 256, deviation", "solbench: null, deviation"), "not a deviation"),
    (("methods: [diffusion_nft], value: 24", "methods: [diffusion_nft, sdxl], value: 24"), "not in the spec"),
])
def test_a_malformed_table_is_an_error_naming_its_line(tmp_path, edit, message):
    spec, table = _copy(tmp_path, "sana_main")
    text = table.read_text()
    assert edit[0] in text
    table.write_text(text.replace(edit[0], edit[1], 1))
    with pytest.raises(ConfigError, match=rf"{re.escape(str(table))}:\d+: .*{message}"):
        check(spec)


@pytest.mark.parametrize("name", SPECS)
def test_a_report_made_elsewhere_finds_the_checkouts_table(tmp_path, monkeypatch, name):
    """Catches the table lookup falling back to the wrong folder (solbench/ instead of the checkout) when the
    report is written from another working directory."""
    from solbench.provenance import find_table

    monkeypatch.chdir(tmp_path)
    assert find_table(name) == ROOT / "experiments" / "provenance" / f"{name}.yaml"
    assert find_table("tiny_main") is None


@pytest.mark.parametrize("name", SPECS)
def test_the_report_of_a_real_spec_lists_every_deviation(name, tmp_path):
    import json

    from solbench.report.provenance import provenance_section
    from solbench.collect.facts import provenance_record

    table = load_table(table_path(ROOT / "experiments" / "x.yaml", name), None)
    record, deviations = provenance_record(name)  # what collect stores beside the results, which the report reads
    (tmp_path / "collect_report.json").write_text(json.dumps({"provenance": record}))
    deviations.to_parquet(tmp_path / "provenance.parquet", index=False)
    summary, shown = provenance_section(SimpleNamespace(experiment=name, results_dir=tmp_path))
    assert len(shown.data) == len(table.deviations()) > 0
    assert set(shown.data["reason"]) == {row.deviation for row in table.deviations()}
    assert all(bullet in summary.text for bullet in table.deviation_bullets())
    assert all(line.startswith("#") for line in header_block(ROOT / "experiments" / f"{name}.yaml").splitlines())
