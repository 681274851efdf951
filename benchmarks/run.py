#!/usr/bin/env python3
"""Run a clustering benchmark suite: ``python benchmarks/run.py --suite smoke|standard|full|shapes``.

Options: ``--via-grpc`` (collector-backed protocols through a real gRPC collector), ``--out DIR``, ``--tuning``,
``--jobs N``, ``--protocols NAME ...``, ``--no-plots``, ``--record-regressions`` (with ``--tuning``), ``--seeds N``, ``--quiet``.
Exit status 1 (with a message naming every failed check) when a run fails, a bound or a required
paper claim does not hold, or a recorded result regressed beyond its tolerance
(``benchmarks/harness/regressions.json``). See ``benchmarks/README.md``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.runner import main

if __name__ == "__main__":
    sys.exit(main())
