"""``python -m solbench.provenance check|header SPEC``: a real spec's provenance problems, or its header block."""

from __future__ import annotations

import sys

from solbench.provenance.check import check, header_block


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("check", "header"):
        print("usage: python -m solbench.provenance check|header SPEC", file=sys.stderr)
        return 2
    if argv[0] == "header":
        print(header_block(argv[1]))
        return 0
    problems = check(argv[1])
    print("\n".join(problems) if problems else f"{argv[1]}: every setting matches its provenance row")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
