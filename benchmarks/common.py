"""What every benchmark script shares: the results directory, the machine block, writing a result.

Each benchmark prints JSON and writes ``benchmarks/results/<name>.json`` (speed targets are
measured only by these scripts), with a ``machine`` block saying where the numbers were measured.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """Python version, CPU count and the BLAS/OpenMP thread settings the run used."""
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "blas_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` as indented JSON to ``benchmarks/results/<name>.json``; returns the path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out
