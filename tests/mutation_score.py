"""Mutation score of the fast method tests over methods/, solbench/method/selection.py, solbench/method/advantages.py.

    pip install "mutmut<3"            # 2.5.1: used only to generate the mutants
    .venv/bin/python tests/mutation_score.py [--limit N]

``mutmut run`` re-imports torch for every mutant (~7 s each, over two hours for the ~980 mutants on two
shared cores), so this script uses mutmut's mutation generator and its own runner: it copies the
repository to a temporary directory (the working tree is never touched), imports torch and pytest
once, and runs the fast method tests (FAST_TESTS) for each mutant in a forked child that re-imports
solbench from the mutated copy. Prints killed / total per file, and the survivors that change more than
a string literal. Not collected by pytest (no test_ prefix).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ["methods/awm.py", "methods/dance_grpo.py", "methods/diffusion_nft.py", "methods/flow_grpo.py",
         "methods/naive_fp4.py", "methods/naive_scaling.py", "methods/sol_rl.py", "solbench/method/selection.py",
         "solbench/method/advantages.py"]
FAST_TESTS = ["tests/test_methods_wiring.py", "tests/test_methods_math.py", "tests/test_methods_registry.py"]


def generate(copy: Path) -> list[dict]:
    import mutmut

    cfg = mutmut.Config(swallow_output=True, test_command="", covered_lines_by_filename=None, coverage_data=None,
                        baseline_time_elapsed=0, dict_synonyms=[], total=0, using_testmon=False, tests_dirs=[],
                        hash_of_tests="", test_time_multiplier=2.0, test_time_base=0.0, pre_mutation=None,
                        post_mutation=None, paths_to_mutate=FILES,
                        mutation_types_to_apply=set(mutmut.mutations_by_type), no_progress=True, ci=False,
                        rerun_all=False)
    out = []
    for f in FILES:
        src = (copy / f).read_text()
        for mid in mutmut.list_mutations(mutmut.Context(source=src, filename=f, config=cfg)):
            mutated, n = mutmut.mutate(mutmut.Context(source=src, mutation_id=mid, filename=f, config=cfg))
            if n and mutated != src:
                out.append({"file": f, "source": mutated, "original": src})
    return out


def run_tests(pytest) -> int | str:
    pid = os.fork()
    if pid == 0:
        for name in list(sys.modules):
            if name == "solbench" or name.startswith(("solbench.", "test_")) or name == "conftest":
                del sys.modules[name]
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        os._exit(int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *FAST_TESTS])))
    deadline = time.time() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def changed_line(m: dict) -> tuple[str, str]:
    for a, b in zip(m["original"].splitlines(), m["source"].splitlines()):
        if a != b:
            return a.strip(), b.strip()
    return "", ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=None, help="run only the first N mutants")
    args = parser.parse_args()
    sys.dont_write_bytecode = True
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "repo"
        shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".venv", ".git", "results", "reports", "__pycache__"))
        (copy / "solbench" / "methods").symlink_to(Path("..") / "methods")  # what the editable install maps
        mutants = generate(copy)[: args.limit]
        os.chdir(copy)
        sys.path.insert(0, str(copy))
        import pytest
        import torch  # noqa: F401  imported once, shared by every forked run

        if run_tests(pytest) != 0:
            print("the fast method tests fail without mutations", file=sys.stderr)
            return 2
        total, killed, survivors = Counter(), Counter(), []
        for m in mutants:
            path = copy / m["file"]
            path.write_text(m["source"])
            try:
                rc = run_tests(pytest)
            finally:
                path.write_text(m["original"])
            total[m["file"]] += 1
            if rc != 0:
                killed[m["file"]] += 1
            else:
                survivors.append((m["file"], *changed_line(m)))
    n, k = sum(total.values()), sum(killed.values())
    strings = sum(1 for _, a, b in survivors if "XX" in b and "XX" not in a)
    print(f"killed {k} of {n} mutants ({k / n:.1%}); {n - k} survived, {strings} of them change only a string "
          f"literal ({k / (n - strings):.1%} without those)")
    for f in FILES:
        print(f"  {f}: {killed[f]}/{total[f]}")
    for f, a, b in survivors:
        if not ("XX" in b and "XX" not in a):
            print(f"SURVIVED {f}: {a!r} -> {b!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
