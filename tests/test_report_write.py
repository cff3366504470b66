"""Writing whole reports: files, header (data hash, SHAs, warnings), HTML, CLI, plugins, failed runs."""

from __future__ import annotations

import base64
import hashlib
import re
from pathlib import Path

import pandas as pd
import pytest

from fixtures.synthetic_results import FAILED, build_main, run_id
from solbench.report import Note, ReportOptions, Table, kinds, report_kind, write_report
from solbench.report.render import markdown_table
from solbench.report.registry import _REGISTRY

FAST = ReportOptions(n_boot=100)


def pages(index: Path) -> str:
    """The report's pages in reading order: the index, then the findings and every other section in full (the
    index links them; solbench/report/pages.py)."""
    return "\n".join((index.parent / name).read_text() for name in ("index.md", "findings.md", "details.md")
                     if (index.parent / name).is_file())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("w")
    build_main(root / "results")
    index = write_report("fx_main", root / "results", root / "reports", options=FAST, strict=True)
    return root, index


def test_report_files_and_header(report):
    root, index = report
    folder = index.parent
    assert index == root / "reports" / "fx_main" / "index.md"
    text = index.read_text()
    digest = hashlib.sha256()
    for path in sorted((root / "results" / "fx_main").glob("*.parquet")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    assert f"sha256:{digest.hexdigest()[:16]}" in text
    assert "`1234567890ab`" in text  # the runs' git SHA
    # every section of the issue, in order, each titled after the paper table it mirrors (on the pages it links)
    text = pages(index)
    titles = [k.title for k in kinds()]
    positions = [text.index(f"## {i}. {t}") for i, t in enumerate(titles, 1)]
    assert positions == sorted(positions)
    for name in ("main_results_tiny.csv", "timing_table5.csv", "timing_phases_chart.png", "learning_curves_tiny.png",
                 "convergence_tiny.csv", "convergence_tiny_chart.png", "ranking_fidelity.csv",
                 "ranking_fidelity_chart.png", "cost_projection_b200.csv", "samples_tiny_sol_rl.png"):
        assert (folder / name).is_file(), name
        assert f"({name})" in text  # linked from the pages
    # CSVs hold the tidy numbers
    csv = pd.read_csv(folder / "main_results_tiny.csv")
    assert {"arm", "metric", "mean", "ci_lo", "ci_hi", "n_seeds", "delta_mean"} <= set(csv.columns)


def test_failed_run_is_named_and_left_out(report):
    _, index = report
    text = index.read_text()
    failed_id = run_id("fx_main", *FAILED[:2])
    warning = text[text.index("runs are not done"):].split("\n\n")[0]
    assert f"`{failed_id}` (naive BF16 scaling, seed 2) is **failed**" in warning
    assert "NonFiniteLossError: loss became NaN at step 5" in warning
    assert "| naive BF16 scaling |" in text
    main = pd.read_csv(index.parent / "main_results_tiny.csv")
    assert (main.loc[main.arm == "naive BF16 scaling", "n_seeds"] == 2).all()


def test_html_has_the_same_content_with_embedded_figures(report):
    _, index = report
    page = (index.parent / "index.html").read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r'src="[^"]+\.png"', page)  # no external image references
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == index.read_text().count("![")
    assert base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<table>" in page and "<h2" in page
    details = (index.parent / "details.html").read_text()
    assert "Table 1 (main results)" in details and "naive BF16 scaling" in details
    assert len(re.findall(r'src="data:image/png;base64,', details)) == (index.parent / "details.md").read_text().count("![")


def test_rewriting_replaces_the_folder(report, tmp_path):
    root, index = report
    stale = index.parent / "stale.csv"
    stale.write_text("x\n")
    again = write_report("fx_main", root / "results", root / "reports",
                         options=ReportOptions(n_boot=50, kinds=("main_results",)), strict=True)
    assert again == index and not stale.exists()
    assert "## 1. Main results (Table 1)" in pages(again) and "## 2." not in pages(again)


def test_mixed_code_versions_warn(tmp_path):
    folder = build_main(tmp_path / "results", images=False)
    runs = pd.read_parquet(folder / "runs.parquet")
    runs.loc[runs.method == "flow_grpo", "git_sha"] = "feedfacefeedfacefeedfacefeedfacefeedface"
    runs.loc[runs.method == "flow_grpo", "dirty"] = True
    runs.to_parquet(folder / "runs.parquet", index=False)
    text = write_report(folder, options=ReportOptions(n_boot=50, kinds=("main_results",)),
                        reports_root=tmp_path / "reports").read_text()
    assert "mix 2 code versions" in text and "`feedfacefeed`" in text
    assert "uncommitted changes" in text


def test_a_failing_plugin_is_reported_unless_strict(report, tmp_path):
    root, _ = report

    @report_kind("zz_broken_for_test", title="Broken", order=999)
    def broken(tables):
        raise RuntimeError("boom")

    try:
        opts = ReportOptions(n_boot=50, kinds=("main_results", "zz_broken_for_test"))
        text = pages(write_report("fx_main", root / "results", tmp_path, options=opts))
        assert "This section failed to render: RuntimeError: boom" in text
        with pytest.raises(RuntimeError, match="boom"):
            write_report("fx_main", root / "results", tmp_path, options=opts, strict=True)
    finally:
        _REGISTRY.pop("zz_broken_for_test")


def test_registry_rejects_bad_plugins_and_names():
    with pytest.raises(ValueError):
        report_kind("Bad Name", title="x")
    with pytest.raises(ValueError, match="already registered"):
        report_kind("main_results", title="again")(lambda tables: None)
    from solbench.errors import ConfigError
    from solbench.report import get_kind

    with pytest.raises(ConfigError, match="did you mean timing"):
        get_kind("timng")

    @report_kind("zz_wrong_type_for_test", title="x")
    def wrong(tables):
        return 42

    try:
        with pytest.raises(TypeError, match="returned a int"):
            get_kind("zz_wrong_type_for_test")(None)
    finally:
        _REGISTRY.pop("zz_wrong_type_for_test")


def test_report_options_validate():
    from solbench.errors import ConfigError

    with pytest.raises(ConfigError, match="refrence_method .did you mean reference_method"):
        ReportOptions.from_mapping({"refrence_method": "awm"})
    assert ReportOptions.from_mapping({"top_k": [2, 3]}).top_k == (2, 3)


def test_markdown_table_escapes_pipes():
    text = markdown_table(pd.DataFrame({"a": ["x|y"], "b": [float("nan")]}))
    assert text.splitlines()[2] == "| x\\|y | - |"


def test_cli_writes_the_report_from_a_spec(tmp_path, capsys):
    from solbench.cli import main

    build_main(tmp_path / "results", experiment="fx_cli", images=False)
    spec = tmp_path / "fx.yaml"
    spec.write_text("name: fx_cli\nreport:\n  reference_method: sol_rl\n  n_boot: 50\n")
    rc = main(["report", str(spec), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports"),
               "--only", "convergence"])
    assert rc == 0
    index = tmp_path / "reports" / "fx_cli" / "index.md"
    assert str(index) in capsys.readouterr().out
    text = pages(index)
    assert "Convergence speedup vs Sol-RL" in text  # the spec's report option was used
    assert main(["report", "no_such_experiment", "--results", str(tmp_path / "results")]) == 2
    assert "no results for experiment" in capsys.readouterr().err


def test_report_with_no_results_says_what_to_do(tmp_path):
    from solbench.errors import SolbenchError

    (tmp_path / "results" / "empty").mkdir(parents=True)
    with pytest.raises(SolbenchError, match="solbench collect"):
        write_report("empty", tmp_path / "results", tmp_path / "reports")


def test_notes_for_missing_inputs(tmp_path):
    from solbench.report import Tables, get_kind

    folder = build_main(tmp_path / "results", images=False)
    pd.DataFrame(columns=["run_id", "step", "prompt_id", "cand_idx", "noise_seed", "precision", "reward",
                          "selected"]).to_parquet(folder / "candidates.parquet", index=False)
    tables = Tables.load(folder, FAST)
    for kind in ("ranking_fidelity", "sample_grids", "sweep_heatmap", "ablations"):
        outputs = get_kind(kind)(tables)
        assert len(outputs) == 1 and isinstance(outputs[0], Note), kind


SMOKE = Path(__file__).resolve().parents[1] / "experiments" / "smoke.yaml"
TINY_WEIGHTS = Path(__file__).resolve().parents[1] / "solbench" / "assets" / "tiny_t2i.safetensors"


@pytest.mark.slow
def test_smoke_spec_run_collect_report(tmp_path):
    """The whole path: `solbench run` of the smoke spec, which collects and ends with the report."""
    if not TINY_WEIGHTS.exists():
        pytest.skip("the tiny model's weights are not built yet (scripts/pretrain_tiny.py)")
    from solbench.cli import main

    rc = main(["run", str(SMOKE), "--results", str(tmp_path / "results"), "--reports", str(tmp_path / "reports")])
    index = tmp_path / "reports" / "smoke" / "index.md"
    text = pages(index)
    assert rc == 0, text
    assert "runs are not done" not in text
    main_results = pd.read_csv(index.parent / "main_results_tiny.csv")
    assert {"DiffusionNFT", "Sol-RL"} <= set(main_results["arm"].str.split(" ").str[0])
    assert (index.parent / "timing_table5.csv").exists() or "No speedup table from the training runs" in text
    assert (index.parent / "index.html").exists()
