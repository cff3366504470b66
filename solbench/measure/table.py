"""What `solbench doctor SPEC --measure` writes: measure.json (everything) and measure.md (the table)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["markdown", "write_outputs"]

_COLUMNS = ("method", "phase", "precision", "images", "seconds", "TFLOP/s", "s / forward", "projected s / forward",
            "peak GB", "doctor GB", "peak / doctor")


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def markdown(result: dict) -> str:
    """The measurement as a Markdown page: a header saying what ran where, one row per phase, notes."""
    gpu = result["device"] or "(no device reported)"
    lines = [f"# Measured: {Path(result['spec']).name} on {gpu}", "",
             f"One iteration per method at {'tiny (test) shapes' if result['tiny'] else 'published shapes'}, one prompt "
             f"group, one rank, random weights (`solbench doctor {result['spec']} --measure`); torch {result['torch']}; "
             f"{result['elapsed_s']} s of a {result['budget_s']:.0f} s budget"
             + ("; each method in its own process" if result.get("isolated") else "") + ". Peak GB: "
             + ("`torch.cuda.max_memory_allocated` over the phase" if "CPU" not in gpu else
                "bytes the phase allocated at its peak (CPU)")
             + "; doctor GB: the doctor's itemised weights plus the phase's activation item (no CUDA-context "
               "overhead); projected s / forward: solbench.report.cost's FLOPs at the paper setting's utilisation "
               f"on the {result.get('hardware_profile') or '(no)'} profile.", "",
             "| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for m in result["methods"]:
        for row in m["phases"]:
            seconds, tflop = row["seconds"], (row["flops"] / 1e12 if row["flops"] else None)
            ratio = row["peak_gb"] / row["predicted_gb"] if row.get("predicted_gb") else None
            idle = row.get("did_work") is False  # a phase that did no work has no time worth printing
            lines.append("| " + " | ".join(_fmt(v) for v in (
                m["method"], row["phase"], row["precision"], row["n_images"], "unmeasured (no work)" if idle else seconds,
                tflop / seconds if tflop and seconds else None, row["seconds_per_forward"],
                row.get("projected_seconds_per_forward"), row["peak_gb"], row.get("predicted_gb"), ratio)) + " |")
    lines.append("")
    for m in result["methods"]:
        extra = [f"setup {m['setup_s']:.1f} s, iteration {m['iteration_s']:.1f} s"]
        if m["recipe"]:
            extra.append(f"explore copy {m['recipe']} on backend {m['backend']}")
        extra += m["notes"]
        if m.get("trained") is False:
            extra.append("**no trainable parameter changed: the train phase did no work**")
        if m["error"]:
            extra.append(f"**stopped: {m['error']}**")
        lines.append(f"- {m['method']} ({m['run_id']}): " + "; ".join(extra))
    for left in result["left_out"]:
        lines.append(f"- not measured: {left['method']} ({left['why']})")
    lines += ["", "Not measured by construction: " + "; ".join(result["not_measured"]) + ".", ""]
    return "\n".join(lines)


def write_outputs(result: dict, out_dir: Path) -> tuple[Path, Path]:
    out_dir = Path(out_dir)
    json_path, md_path = out_dir / "measure.json", out_dir / "measure.md"
    json_path.write_text(json.dumps(result, indent=1) + "\n")
    md_path.write_text(markdown(result))
    return json_path, md_path
