"""A report is built from stored results alone (issue 52, item 7): what it once computed from code at report time
(the share of a forward a recipe quantizes, a recipe's format, the paper models' FLOPs, text tokens and trained
timesteps, the eval grid's prompts) is recorded by the runs (facts.json) and by `solbench collect`, and the report
reads only the collected tables. Results collected before that get one line naming `solbench collect SPEC`, and the
sections that need a fact say it is missing instead of computing it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from fixtures.arm_results import Arm, build_arms
from solbench.report import ReportOptions

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("solbench.quant", "solbench.models", "solbench.models.activations", "solbench.models.flops", "solbench.methods",
           "solbench.spec", "solbench.config", "solbench.world")

# The cost projection's numbers as solbench.report.cost computed them from code before the report read stored
# facts (commit 4eadd8e, `paper_projection(hw)`): seconds per iteration on 8 GPUs and the model columns.
GOLDEN = {
    "B200": {
        "FLUX.1": (183.78105563323433, 77.85896703714704, 273.97322561061213, 171.4807520556376),
        "SD3.5-L": (611.8103367536945, 367.35397326443785, 836.411950129775, 604.0363128984881),
        "SANA": (79.98054075444391, 54.33759906575003, 106.08425690040559, 82.08297470582826),
    },
    "H100": {
        "FLUX.1": (417.6842173482599, 237.35002218215632, 622.6664218423005, 451.359414975711),
        "SD3.5-L": (1390.4780380765783, 954.476000361813, 1900.936250294943, 1494.8308291634467),
        "SANA": (181.77395626009982, 136.98592561623948, 241.1005838645582, 200.31893185785495),
    },
}
# px, text tokens, forwards per step, trained timesteps, TFLOP per forward, quantized and attention shares
GOLDEN_MODEL = {"FLUX.1": (512, 128, 1, 4, 15.812527128576, 0.940978982693701, 0.058784080982488),
                "SD3.5-L": (1024, 205, 2, 6, 30.028665177088, 0.490517652208888, 0.227724635768413),
                "SANA": (1024, 300, 2, 6, 2.96666116096, 0.560168158692663, 0.020597487574289)}
MODEL_COLUMNS = ("resolution", "text_tokens", "rollout_passes", "train_timesteps", "tflops_per_forward",
                 "quantized_share", "attention_share")
CELLS = ("rollout_naive", "rollout_sol", "e2e_naive", "e2e_sol")

SHARE = 0.5  # the recorded share of Sol-RL's explore forward in low precision (not what any code computes)
RECIPE = "te_delayed_e2m1_flux"  # an FP8 (E5M2) recipe whose name does not say its format


def test_the_cost_projection_from_stored_facts_is_todays(tmp_path):
    """The golden check: the projection priced from the facts collect stores (the committed asset) gives the
    numbers solbench.report.cost computed from code before it read stored facts, on both hardware profiles, to
    1e-9. Catches a fact stored wrongly (a share of the linear instead of the whole forward, the text tokens of
    the pipeline, a lost trained timestep) and the arithmetic changed on the way."""
    from solbench.report.cost import paper_projection, stored_models
    from solbench.collect.facts import paper_model_facts

    models = stored_models(paper_model_facts())
    for hw, cells in GOLDEN.items():
        df = paper_projection(models, hw).set_index("model")
        for model, values in cells.items():
            for cell, value in zip(CELLS, values):
                assert df.loc[model, f"{cell}_projected_s"] == pytest.approx(value, rel=1e-9), (hw, model, cell)
            for column, value in zip(MODEL_COLUMNS, GOLDEN_MODEL[model]):
                assert df.loc[model, column] == pytest.approx(value, rel=1e-9), (hw, model, column)


def _arms(tmp_path, name="stored"):
    """naive BF16 scaling: rollout 10 GFLOP, train 2 GFLOP; Sol-RL: explore 6 GFLOP, regenerate 2, train 2."""
    extra = {"p_quant.backend": "emulated", "p_quant.recipe": RECIPE}
    build_arms(tmp_path, name, [
        Arm("naive_scaling", seeds=(0, 1), steps=(0, 2), extra=extra,
            phases=[("rollout", "full", 10e9, 1.0), ("train", "full", 2e9, 0.25)]),
        Arm("sol_rl", seeds=(0, 1), steps=(0, 2), extra={**extra, "fact_quantized_share": SHARE},
            phases=[("explore", "explore", 6e9, 0.5), ("regenerate", "full", 2e9, 0.25),
                    ("train", "full", 2e9, 0.25)])], options=ReportOptions(n_boot=200))
    return tmp_path / name


def _report_text(folder: Path) -> str:
    """Every Markdown page of a written report (sections may live on linked pages)."""
    return "\n".join(p.read_text() for p in sorted(folder.glob("*.md")))


def _blocked_report(results: Path, reports: Path) -> subprocess.CompletedProcess:
    script = textwrap.dedent(f"""
        import sys
        BLOCKED = {BLOCKED!r}

        class Block:
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"blocked for the report: {{name}}")
                return None

        sys.meta_path.insert(0, Block())
        import solbench.report
        from solbench.report import ReportOptions, write_report

        write_report({str(results)!r}, reports_root={str(reports)!r}, options=ReportOptions(n_boot=200), strict=True)
        print("loaded:", sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)))
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_the_report_is_written_with_the_code_it_must_not_read_blocked(tmp_path):
    """Imports solbench.report and writes a whole report (strict: a section that fails raises) in a process where
    importing solbench.quant, models, activations, flops, methods, spec, config or world raises. Catches any report
    module reaching for them, at import or lazily in a section, and the numbers they gave going missing: the cost
    projection's (from the collected paper-model facts), the projected clock's (the recorded share: 0.5, which no
    code computes) and the explore copy's format (FP8 E5M2, which the recipe's name does not say)."""
    results = _arms(tmp_path)
    done = _blocked_report(results, tmp_path / "reports")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    folder = tmp_path / "reports" / "stored"
    text = _report_text(folder)
    assert "These results were collected before" not in text  # the facts are there: no upgrade line
    # cost projection: the Table 5 cells as today's code projected them, from the stored facts
    b200 = pd.read_csv(folder / "cost_projection_b200.csv").set_index("model")
    for model, cells in GOLDEN["B200"].items():
        for cell, value in zip(CELLS, cells):
            assert b200.loc[model, f"{cell}_projected_s"] == pytest.approx(value, rel=1e-9)
    assert "184 (paper 184, -0%)" in text and "78 (paper 79, -1%)" in text and "2.36x / 1.60x" in text
    # the projected clock of these runs: counted FLOPs at B200 peaks (BF16 2.25, NVFP4 9 PFLOP/s) x mfu 0.4
    bf16, fp4, mfu = 2.25e15, 9e15, 0.4
    sol = (6e9 * (SHARE / fp4 + (1 - SHARE) / bf16) + 4e9 / bf16) / mfu
    naive = 12e9 / bf16 / mfu
    runs = pd.read_csv(folder / "cost_projection_runs.csv").set_index("arm")
    assert runs["projected_s"].to_dict() == pytest.approx({"naive BF16 scaling": naive, "Sol-RL": sol}, rel=1e-9)
    rollout = (10e9 / bf16) / (6e9 * (SHARE / fp4 + (1 - SHARE) / bf16) + 2e9 / bf16)  # 1.74x; 1.62x at share 0.95
    assert f"| {rollout:.2f}x |" in text
    # the explore copy named by its recorded format
    assert f"FP8 (E5M2, per tensor) ({RECIPE})" in text


def test_no_report_module_imports_the_code_it_reads_results_of():
    """The static side of the blocked-import test: every import statement in solbench/report (lazy ones inside
    functions too, which a report section reaches only for some results). Catches `from solbench.quant import ...`
    or `import solbench.config` anywhere in the package, even in a section the synthetic results do not reach."""
    found = []
    for path in sorted((ROOT / "solbench" / "report").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names
                      if any(n == b or n.startswith(b + ".") for b in BLOCKED)]
    assert not found


def _make_old(results: Path) -> None:
    """The folder as a collect before the facts wrote it: no fact columns, no paper-model facts table."""
    runs = pd.read_parquet(results / "runs.parquet")
    runs.drop(columns=[c for c in runs.columns if c.startswith("fact_") or c == "facts_schema"]).to_parquet(
        results / "runs.parquet", index=False)
    (results / "paper_model_facts.parquet").unlink()


def test_results_that_predate_the_facts_get_one_line_naming_the_collect_that_adds_them(tmp_path):
    """Results collected before the facts were recorded. Catches the report computing them from code again (a
    projection where the tables have no facts), a section failing instead of saying what is missing, and the
    upgrade line missing, repeated or not naming the command with the spec given."""
    from solbench.report import write_report
    from solbench.report.build import completeness_warnings

    results = _arms(tmp_path / "results", "old")
    _make_old(results)
    spec = tmp_path / "old.yaml"
    spec.write_text("name: old\n")
    warnings = completeness_warnings(spec, results, pd.read_parquet(results / "runs.parquet")["run_id"])
    upgrade = [w for w in warnings if "collected before solbench recorded the facts" in w]
    assert len(upgrade) == 1 and f"`solbench collect {spec}`" in upgrade[0] and "\n" not in upgrade[0]
    index = write_report(spec, tmp_path / "results", tmp_path / "reports", options=ReportOptions(n_boot=200),
                         strict=True)
    text = _report_text(index.parent)
    lines = {page.name: [line for line in page.read_text().splitlines()
                         if "collected before solbench recorded the facts" in line] for page in index.parent.glob("*.md")}
    # once on the first screen (and at most once on each linked page that repeats the header)
    assert len(lines["index.md"]) == 1 and max(map(len, lines.values())) == 1
    assert all(f"`solbench collect {spec}`" in line for page in lines.values() for line in page)
    assert "lack the paper models' facts" in text and "paper 184" not in text  # said, not computed
    assert not (index.parent / "cost_projection_b200.csv").exists()
    assert "have no projected clock" in text and "failed to render" not in text


def test_collect_records_the_facts_and_brings_old_results_up_to_date(tmp_path):
    """collect derives each run's facts from its spec.json (the share computed as solbench.models.shares does, the
    recipe's format, the default recipe, the grid prompts) unless the run recorded them itself (facts.json, which
    wins), and copies the paper models' facts. Catches a re-collect that leaves old results without facts, the run's
    own record overridden by today's code, and a share computed for a run that explored nothing."""
    from solbench.config import RunConfig
    from solbench.models.shares import precision_split
    from solbench.collect import collect
    from solbench.results import RunStore
    from solbench.train.facts import FACTS_FILE, run_facts

    exp = tmp_path / "exp"
    stores = {}
    for method, seed in (("sol_rl", 0), ("sol_rl", 1), ("flow_grpo", 0)):
        cfg = RunConfig(experiment="exp", method=method, seed=seed)
        store = RunStore(exp / cfg.run_id, cfg.run_id)
        store.write_json("spec.json", cfg.to_dict())
        store.write_status("done")
        precision = "explore" if method == "sol_rl" else "full"
        store.append("timings", [{"step": 1, "phase": "rollout", "precision": precision, "seconds": 1.0,
                                  "n_images": 4, "flops": 1e9}])
        stores[(method, seed)] = (cfg, store)
    cfg, own = stores[("sol_rl", 1)]
    own.write_json(FACTS_FILE, {**run_facts(cfg.to_dict(), explores=True), "fact_quantized_share": 0.25})
    result = collect(exp, [c.run_id for c, _ in stores.values()] + ["missing-run"])
    runs = pd.read_parquet(exp / "runs.parquet").set_index("run_id")
    base, _ = stores[("sol_rl", 0)]
    expected = precision_split("tiny", base.quant.recipe, resolution=base.model.resolution, backend="te").quantized_share
    assert runs.loc[base.run_id, "fact_quantized_share"] == pytest.approx(expected)
    assert runs.loc[cfg.run_id, "fact_quantized_share"] == 0.25  # the run's own record
    assert pd.isna(runs.loc[stores[("flow_grpo", 0)][0].run_id, "fact_quantized_share"])
    assert set(runs["facts_schema"]) == {1} and set(runs["fact_explore_format"]) == {"nvfp4"}
    assert set(runs["fact_default_explore_recipe"]) == {"nvfp4_tiny_flux"}
    prompts = json.loads(runs.loc[base.run_id, "fact_eval_grid_prompts"])
    assert len(prompts) == min(base.eval.grid_prompts, base.eval.n_prompts or 10**9) and all(prompts)
    assert "paper_model_facts" in result.tables and len(pd.read_parquet(exp / "paper_model_facts.parquet")) == 3
    assert json.loads((exp / "collect_report.json").read_text())["spec_runs"][-1] == "missing-run"
    # old results: stripped, then collected again
    _make_old(exp)
    collect(exp)
    again = pd.read_parquet(exp / "runs.parquet").set_index("run_id")
    assert again.loc[base.run_id, "fact_quantized_share"] == pytest.approx(expected)
    assert (exp / "paper_model_facts.parquet").is_file()


def test_a_tiny_run_on_random_or_shipped_weights_records_the_shipped_architectures_share():
    """`model.path: random` (the test specs') and `pretrained` build the shipped tiny architecture. Catches the share
    looked up in a folder named "random" (no such file: the run left out of the projected clock)."""
    from solbench.models.shares import precision_split
    from solbench.train.facts import run_facts

    shipped = precision_split("tiny", "nvfp4_tiny_flux", backend="te").quantized_share
    for path in ("random", "pretrained", None):
        facts = run_facts({"model": {"name": "tiny", "path": path}, "quant": {"recipe": "nvfp4_tiny_flux"}},
                          explores=True)
        assert facts["fact_quantized_share"] == pytest.approx(shipped) and facts["fact_notes"] == ""


def test_sample_grid_seed_labels_are_legible_at_the_saved_size(tmp_path):
    """Issue 52: the sample grids' seed labels were 6 pt. Catches any text of a sample figure under 7 pt when saved
    at the report's 110 dpi (points are 1/72 inch: 7 pt is 10.7 px at 110 dpi), measured with matplotlib's extents."""
    from PIL import Image

    from solbench.report.samples import _arm_figure

    folder = tmp_path / "run" / "samples"
    folder.mkdir(parents=True)
    for step in (0, 4):
        Image.new("RGB", (128, 64), (200, 40, 40)).save(folder / f"eval_step_{step:06d}.png")
        (folder / f"eval_step_{step:06d}.json").write_text(json.dumps(
            {"rows": [{"text": "a red circle"}, {"text": "two blue squares"}], "columns": 4}))
    run = pd.Series({"run_id": "r", "seed": 0})
    figure = _arm_figure("tiny", "Sol-RL", run, {0: folder / "eval_step_000000.png", 4: folder / "eval_step_000004.png"})
    fig = figure.figure
    fig.savefig(tmp_path / "grid.png", dpi=110)
    texts = [t for t in fig.findobj(lambda o: hasattr(o, "get_fontsize") and hasattr(o, "get_text"))
             if t.get_text().strip() and t.get_visible()]
    seeds = [t for t in texts if t.get_text().startswith("seed ")]
    assert len(seeds) == 8  # four seed columns in each of the two grids
    assert min(t.get_fontsize() for t in texts) >= 7
    assert all(t.get_fontsize() * 110 / 72 >= 10.6 for t in seeds)
