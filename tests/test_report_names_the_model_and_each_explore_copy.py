"""The report names what ran: the header gives the weights' sha256 and width and the explore recipe with its MAC
share, and an arm of recipe none (the full-precision, step-budget-only control) names no low-precision backend in
the findings' explore text or the fidelity setup table (issues 42, 48, 54).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from _report_outputs import fidelity_arm_tables, linear, named
from fixtures.arm_results import Arm, build_arms, fidelity_run
from solbench.report import ReportOptions

OPTS = ReportOptions(n_boot=400)


def test_the_header_names_the_weights_width_and_explore_copy(tmp_path):
    """Catches: a report whose header says only "models | tiny" (the committed width-128 report was read as the
    shipped model's): it must give the weights' sha256 and width and the explore recipe with its MAC share."""
    from solbench.report import write_report

    sha = "d6405637" + "ab" * 28
    identity = {"sha256": sha, "width": 256, "parameters": 7151104,
                "weights": "/site/solbench/assets/tiny_t2i.safetensors"}
    fid, cand = fidelity_run("hdr", "fid-flux", "nvfp4_tiny_flux", rho_noise=lambda i: 0.1,
                             rng=np.random.default_rng(1), share=(0.995, 41, 48), identity=identity)
    flux = {"p_quant.recipe": "nvfp4_tiny_flux"}
    tables = build_arms(tmp_path / "results", "hdr", [
        Arm("sol_rl", gain=linear(0.01), phases=[("explore", "explore", 1e9, 1.0), ("train", "full", 1e9, 1.0)],
            extra=flux),
        Arm("diffusion_nft", gain=linear(0.0), phases=[("rollout", "full", 1e9, 1.0)], extra=flux)],
        extra_runs=[fid], candidates=cand, options=OPTS)
    index = write_report(tables.results_dir, tables.results_dir.parent, tmp_path / "reports",
                         options=ReportOptions(n_boot=100, kinds=("findings",)))
    head = (index.parent / "provenance.md").read_text()  # the full header, linked from the index's first lines
    assert "width 256" in head and "7,151,104 transformer parameters" in head
    assert f"sha256 `{sha}`" in head and "`tiny_t2i.safetensors`" in head
    assert ("NVFP4 (nvfp4_tiny_flux), 99.5 % of the linear MACs in low precision (41 of 48 Linears), emulated "
            "backend") in head


def test_a_step_budget_only_arm_names_no_low_precision_backend():
    # Bug caught (tiny_paper's rerun): the recipe-none control read "step budget only (full precision), emulated
    # backend (fake-quantized in full precision)", which says both that nothing and that everything was quantized.
    from solbench.report.explore import explore_text

    none = pd.DataFrame({"p_quant.recipe": ["none"], "p_quant.backend": ["emulated"]})
    assert explore_text(none) == "step budget only (full precision)"
    fp4 = pd.DataFrame({"p_quant.recipe": ["nvfp4_tiny_flux"], "p_quant.backend": ["emulated"]})
    assert explore_text(fp4).endswith("emulated backend (fake-quantized in full precision)")


def test_a_full_precision_control_is_never_labelled_emulated_backend(tmp_path):
    """Catches the fidelity setup table naming recipe "none" (full precision) an emulated low-precision backend."""
    tables, _ = fidelity_arm_tables(OPTS, tmp_path, "ctrl", [("fid-none", "none", None), ("fid-base", "nvfp4_tiny_flux", None)])
    setup = named(tables, "ranking_fidelity", "ranking_fidelity_setup").display.set_index("explore recipe")
    assert setup.loc["none", "backend"] == "- (full precision)" and setup.loc["nvfp4_tiny_flux", "backend"] == "emulated"
