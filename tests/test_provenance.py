"""The provenance tables of the real specs (experiments/provenance/<spec>.yaml, solbench.provenance).

Every setting a reference fixes has a row (repository, file, line or config key, value); the spec,
expanded, must resolve to each row's value, or to its `solbench` value where the row declares a
deviation with a one-line reason; the spec's header and the report list the deviations. Changing a
value on either side, a reason, or dropping a row fails.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from solbench.errors import ConfigError
from solbench.provenance import REQUIRED, check, header_block, load_table, table_path

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
    assert "finetune.ema_every" not in REQUIRED  # only methods whose evaluation samples the EMA need it


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
def test_the_report_of_a_real_spec_lists_every_deviation(name):
    from solbench.report.provenance import provenance_section

    table = load_table(table_path(ROOT / "experiments" / "x.yaml", name), None)
    summary, shown = provenance_section(SimpleNamespace(experiment=name))
    assert len(shown.data) == len(table.deviations()) > 0
    assert set(shown.data["reason"]) == {row.deviation for row in table.deviations()}
    assert all(bullet in summary.text for bullet in table.deviation_bullets())
    assert all(line.startswith("#") for line in header_block(ROOT / "experiments" / f"{name}.yaml").splitlines())
