#!/usr/bin/env python3
"""Benchmark of the ternary gemm kernels (fused, cuBLAS paths, gemlite) on one GPU.

The same code as `ternary bench` (ternary/gemm_bench.py); run from the repository root after
building the extension in place, e.g.
  python3 bench/bench_gemm.py --json bench.json
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ternary.tools.gemm_bench import main

if __name__ == "__main__":
    sys.exit(main())
