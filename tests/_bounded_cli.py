"""Runs `solbench` command lines in one process under an address-space limit, for tests/test_hostile_*.py.

``python tests/_bounded_cli.py LIMIT_BYTES CASES_JSON``: CASES_JSON is a file holding a list of
``{"argv": [...], "cwd": "..."}``; each case runs ``solbench.cli.main(argv)`` in its ``cwd`` with stdout and
stderr captured, and the answer (printed as JSON, one object per case) holds its exit status (or the name of the
exception that escaped, MemoryError where the limit was hit), the first 20,000 characters of each stream and its
full length, and the process's peak resident memory after the case (``maxrss_mb``). The limit
(``resource.RLIMIT_AS``) makes a regression that would take the machine fail the case instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import traceback


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
                        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
