"""The report's glossary: one page per report (glossary.md) defining its jargon, and the links to it.

Each term of ``TERMS`` has an anchor on the glossary page; ``link_terms`` links a page's first use of each term
(outside headings, code, links and images) to its definition, so a reader meets no undefined word. The
definitions say what the report computes; docs/reports.md gives the formulas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GLOSSARY_PAGE = "glossary.md"


@dataclass(frozen=True)
class Term:
    name: str  # as the glossary heads it
    anchor: str
    pattern: str  # a regular expression of its uses in the report's text
    text: str


TERMS: tuple[Term, ...] = (
    Term("verdict rule", "verdict-rule", r"\b(?:verdicts?|reproduced|contradicted|inconclusive)\b",
         "Every claim is written as effect > threshold (or <). **reproduced**: the whole 95 % interval lies on the "
         "claim's side of the threshold; **contradicted**: it lies wholly on the other side; **inconclusive**: it "
         "spans or touches the threshold, has zero width, or there is none; **not measured by this spec**: the "
         "results lack the arms or the clock the claim needs; **projection**: computed from the configuration, "
         "never judged. A primary claim is one of the eight named in the code before any result was read; every "
         "other row is exploratory (no correction for multiple comparisons)."),
    Term("interval kinds", "interval-kinds", r"95 ?% (?:interval|t interval|\[)|\b95 ?%",
         "Intervals are two-sided 95 %. A quality difference between two arms is paired (same run seed, same eval "
         "prompts and noise) and its interval is the crossed-design one (below). A mean over seeds gets a Student-t "
         "interval over the seeds (one seed: none). A speedup gets a t interval of the log ratio of the two arms' "
         "seed means (delta method, Welch's degrees of freedom). Convergence ratios use a bootstrap over each arm's "
         "seeds. Table 8's ρ, τ and hit@K get a t interval over the prompt groups."),
    Term("crossed design", "crossed-design", r"\bcrossed(?:[- ]design)?\b",
         "Every run evaluates the same eval prompts, so a paired difference d[seed, prompt] has run seeds crossed "
         "with prompts, both random draws: d = μ + seed + prompt + residual. The interval uses the variance of the "
         "grand mean σ²_seed/S + σ²_prompt/P + σ²_e/(SP) estimated from the two-way layout's mean squares. With fewer "
         "than 3 run seeds the seed variance is not estimated and the interval covers the eval prompts only (†)."),
    Term("Satterthwaite", "satterthwaite", r"\bSatterthwaite(?:'s)?\b",
         "Satterthwaite's approximation: the degrees of freedom of a variance that is a sum of several mean squares "
         "(here the crossed design's), used for its Student-t interval and for the power calculation."),
    Term("mde", "mde", r"\bmde\b",
         "Minimum detectable effect: the smallest distance of the true effect from the claim's threshold that these "
         "runs would put wholly on one side of it with 80 % power at the 5 % level, from their own variance "
         "components. An inconclusive claim with a true effect smaller than its mde is expected; 'what would decide "
         "it' gives the run seeds (or eval prompts) whose mde reaches the paper's effect."),
    Term("recipe", "recipe", r"\brecipes?\b",
         "An explore recipe says which layers of the policy's explore copy are quantized and to which format: "
         "nvfp4_tiny_flux (FLUX's rule: every block Linear in NVFP4), nvfp4_tiny (SANA's rule: attention kept in full "
         "precision), mxfp4_tiny_flux and mxfp4_w4a4 (coarser MXFP4 copies), none (full precision)."),
    Term("backend", "backend", r"\bbackends?\b|\bcpu_bf16\b|\bemulated\b",
         "How the explore copy's low-precision values are computed: cpu_bf16, the format's values multiplied on the "
         "CPU's bf16 units (a real speedup on CPUs that have them); emulated, fake-quantized and multiplied in full "
         "precision (the same numbers, no speedup: a clock measured on it says nothing about FP4 hardware); te, "
         "TransformerEngine on Blackwell GPUs."),
    Term("dose", "dose", r"\bdose(?:-response)?\b",
         "The dose-response compares naive FP4 with Sol-RL on explore copies of growing error; the dose of a copy is "
         "its sample error x0_rel_dist. If training on low-precision samples is what hurts naive FP4, its gap to "
         "Sol-RL grows with the dose."),
    Term("x0_rel_dist", "x0-rel-dist", r"\bx0_rel_dist\b",
         "The explore copy's sample error: the distance between the images (x0) the explore copy and the full-"
         "precision policy draw from the same noise, over the spread of the full-precision samples (0: identical)."),
    Term("projection", "projection", r"\bPROJECT(?:ION|ED)\b|\bprojections?\b|\bprojected\b",
         "A PROJECTION is computed from the runs' counted FLOPs at a hardware profile's peak rates (B200, H100) and "
         "an assumed utilisation; it is never measured and never judged. The projected GPU clock prices each phase's "
         "FLOPs at the precision they ran at."),
    Term("φ", "phi", r"φ",
         "The φ coefficient of a 2 x 2 table. For a pass/fail reward Spearman ρ, Kendall τ-b and φ of the pass/fail "
         "table are one number, reported once as φ and not judged against the threshold set for graded rewards."),
    Term("ρ, τ and hit@K", "rank-statistics", r"\bhit@\d+\b|ρ|τ",
         "Table 8's ranking fidelity of the explore copy against full precision on the same seeds of a prompt: "
         "Spearman ρ and Kendall τ of the two rankings, and hit@K, the share of the full-precision top K that the "
         "explore copy also puts in its top K (chance: K / N), each averaged over prompts."),
    Term("†", "dagger", r"†",
         "Marks an interval that covers the eval prompts only: its arm has fewer than 3 run seeds, so the "
         "seed-to-seed variance is not estimated."),
    Term("units", "units", r"\bover \d+ units\b|\bthe units whose\b",
         "The independent replicates an interval is computed over (run seeds, or run seeds crossed with eval "
         "prompts). 'No spread over 3 units' means the replicates agreed exactly: there is no interval."),
    Term("Δ", "delta", r"Δ",
         "A difference: in Table 1 a run's score minus its own step-0 score (the base model on the same prompts and "
         "seeds), averaged over run seeds; in comparisons, arm minus reference, paired by run seed."),
)


def glossary_page(experiment: str) -> str:
    """The glossary.md of a report."""
    lines = [f"# Glossary: `{experiment}`", "", "[Back to the report](index.md)", ""]
    for term in TERMS:  # an ASCII heading, so that its anchor is the same in python-markdown's toc and on GitHub
        lines += [f"## {term.anchor.replace('-', ' ')}", "", f"**{term.name}**: {term.text}", ""]
    return "\n".join(lines).rstrip() + "\n"


# spans a link must not be put into: code, links and images, raw anchors
_PROTECTED = re.compile(r"`[^`]*`|!?\[[^\]]*\]\([^)]*\)|<[^>]+>")


def link_terms(markdown: str, page: str = GLOSSARY_PAGE) -> str:
    """``markdown`` with each glossary term's first use linked to its definition on ``page`` (headings, code, links
    and images are left alone)."""
    pending = list(TERMS)
    out = []
    for line in markdown.split("\n"):
        if not pending or line.startswith("#") or line.startswith("|---") or line.startswith("!["):
            out.append(line)
            continue
        for term in list(pending):
            new = _link_first(line, term, page)
            if new is not None:
                line = new
                pending.remove(term)
        out.append(line)
    return "\n".join(out)


def _link_first(line: str, term: Term, page: str) -> str | None:
    """The line with the term's first use outside protected spans linked, or None where it has none."""
    protected = [m.span() for m in _PROTECTED.finditer(line)]
    for match in re.finditer(term.pattern, line):
        start, end = match.span()
        if any(a < end and start < b for a, b in protected) or line[start - 1:start] == "[":
            continue  # inside code, a link or an image, or a bracketed '[95 %]' (a link would nest brackets)
        text = match.group(0)
        link = f"[{text}]({page}#{term.anchor})"
        if line.startswith("|") and _cell_around(line, start, end) + len(link) - len(text) > TABLE_CELL_CHARS:
            continue  # a link would take the cell past the first page's bound
        return f"{line[:start]}{link}{line[end:]}"
    return None


#: the most characters a table cell may have once a link is written into it (the first page's primary claims are
#: held under 120)
TABLE_CELL_CHARS = 119


def _cell_around(line: str, start: int, end: int) -> int:
    """The length of the pipe-table cell of ``line`` that holds [start, end)."""
    left = max(line.rfind("|", 0, start), 0)
    right = line.find("|", end)
    return len(line[left + 1:right if right >= 0 else None].strip())
