"""`python -m solbench ...` (what torchrun starts: `torchrun --nproc-per-node 8 -m solbench run SPEC`)."""

import sys

from solbench.cli import main

sys.exit(main())
