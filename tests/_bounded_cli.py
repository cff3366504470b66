"""Runs `solbench` command lines in one process under an address-space limit, for tests/test_hostile_*.py
(``bounded``, ``one_line``).

``python tests/_bounded_cli.py LIMIT_BYTES CASES_JSON``: CASES_JSON is a file holding a list of
``{"argv": [...], "cwd": "..."}``; each case runs ``solbench.cli.main(argv)`` in its ``cwd`` with stdout and
stderr captured, and the answer (printed as JSON, one object per case) holds its exit status (or the name of the
exception that escaped, MemoryError where the limit was hit), the first 20,000 characters of each stream and its
full length, and the process's peak resident memory after the case (``maxrss_mb``, VmHWM). The limit
(``resource.RLIMIT_AS``) makes a regression that would take the machine fail the case instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import subprocess
import sys
import traceback
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
LIMIT = 2 * 2**30  # the address space the commands run in
PEAK_MB = 1024  # what a case may reach (the interpreter with torch imported takes about 350 MB)


def bounded(tmp_path: Path, *cases: list[str] | dict) -> list[dict]:
    """Run ``solbench ARGV`` for each case (an argv list, or {"argv": ..., "cwd": ...}) in one subprocess under
    LIMIT; the answers (see the module's docstring). Every case's peak memory is held under PEAK_MB; the
    timeout is a safety net, not a measurement."""
    cases_file = tmp_path / "cases.json"
    cases_file.write_text(json.dumps([c if isinstance(c, dict) else {"argv": c} for c in cases]))
    # pyarrow's jemalloc pool reserves address space far beyond what it uses (a 10 MB string in a table: a
    # bad_alloc under the limit at 0.5 GB resident); the system allocator's use is what the limit measures
    env = {**os.environ, "SOLBENCH_WORKERS": "1", "ARROW_DEFAULT_MEMORY_POOL": "system",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run([sys.executable, __file__, str(LIMIT), str(cases_file)], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.splitlines()[-1])
    for case, answer in zip(cases, answers):
        assert answer["maxrss_mb"] < PEAK_MB, (case, answer)
    return answers


def one_line(answer: dict, command: str) -> str:
    """The one error line of a refused command (exit status 2, nothing else on stderr, no traceback)."""
    assert answer["rc"] == 2, answer
    lines = [line for line in answer["stderr"].splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"solbench {command}: error: "), answer["stderr"][-2000:]
    return lines[0]


def main() -> None:
    limit, cases_file = int(sys.argv[1]), sys.argv[2]
    with open(cases_file) as handle:
        cases = json.load(handle)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    from solbench.cli import main as cli

    answers = []
    for case in cases:
        os.chdir(case.get("cwd") or os.getcwd())
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli(case["argv"])
            except SystemExit as exit_:
                rc = exit_.code
            except BaseException as escaped:  # noqa: BLE001 - MemoryError, RecursionError: the case's answer
                rc = type(escaped).__name__
                err.write(traceback.format_exc(limit=-3))
        stdout, stderr = out.getvalue(), err.getvalue()
        answers.append({"rc": rc, "stdout": stdout[:20_000], "stdout_chars": len(stdout), "stderr": stderr[:20_000],
                        "stderr_chars": len(stderr),
                        "maxrss_mb": peak_rss_mb()})
    print(json.dumps(answers))


def peak_rss_mb() -> float:
    """This process's peak resident memory since it exec'd (VmHWM): getrusage's ru_maxrss also keeps the high-water
    mark of the process it was forked from (a pytest process of 1 GB after a long suite), which is not this one's."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc: the inherited mark, an upper bound


if __name__ == "__main__":
    main()
