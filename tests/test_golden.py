"""Behaviour pinned byte for byte: seeded ``fit``, ``demo`` and ``run`` outputs against committed files.

Each case runs a command of the CLI in this process with a fixed seed and compares what it wrote
(model messages, ledger lines, dead letters) with ``tests/golden/<case>.json``. Only what a run
cannot repeat is masked: wall-clock timestamps (``created_at``), the ledger's random id (and the
genesis line's checksum, which covers both). Everything else, every float of every natural
parameter included, must be identical: a restructuring of the code moves no number.

A deliberate change of behaviour rewrites the files (and the diff shows what moved)::

    STREAM_VIPS_GOLDEN=update python -m pytest tests/test_golden.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stream_vips.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("STREAM_VIPS_GOLDEN") == "update"
MASKED = ("created_at", "ledger_id", "supersedes")


def mask(value: Any) -> Any:
    """``value`` with every field a run cannot repeat replaced by ``"<masked>"`` (a dead letter's
    source path by its file name: the directory is a fresh temporary one)."""
    if isinstance(value, dict):
        out = {k: "<masked>" if k in MASKED else Path(v).name if k == "path" else mask(v) for k, v in value.items()}
        if "genesis" in out:
            out["sha256"] = "<masked>"  # covers the genesis' id and time
        return out
    if isinstance(value, list):
        return [mask(v) for v in value]
    return value


def read_lines(path: Path) -> list[Any]:
    return [mask(json.loads(line)) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def check(case: str, outputs: dict[str, Any]) -> None:
    """Compare ``outputs`` with the committed file of ``case`` (or write it when updating)."""
    path = GOLDEN / f"{case}.json"
    text = json.dumps(outputs, indent=1, sort_keys=True) + "\n"
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: STREAM_VIPS_GOLDEN=update python -m pytest {__file__}"
    expected = json.loads(path.read_text())
    assert outputs == expected, f"{case}: the outputs moved (STREAM_VIPS_GOLDEN=update shows how)"
    assert text == path.read_text()  # byte for byte, floats included


# --- the data: small public synthetic sets, fixed seeds ------------------------------------------

def regression_records(n: int, d: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, d))
    y = np.clip(X @ np.linspace(-0.8, 0.8, d) + 0.1 * rng.normal(size=n), -1, 1)
    return [{"x": x, "y": float(v)} for x, v in zip(X.round(6).tolist(), y.round(6).tolist())]


def logistic_records(n: int, d: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    X = np.hstack([rng.normal(scale=0.5, size=(n, d - 1)), np.ones((n, 1))])
    p = 1 / (1 + np.exp(-(X @ np.linspace(-1.5, 1.5, d))))
    return [{"x": x, "y": int(v)} for x, v in zip(X.round(6).tolist(), (rng.uniform(size=n) < p).tolist())]


def sbn_records(n: int, d: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"y": row} for row in (rng.uniform(size=(n, d)) < np.linspace(0.1, 0.9, d)).astype(int).tolist()]


def lda_records(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    topics = rng.dirichlet(np.full(12, 0.3), size=3)
    docs = []
    for _ in range(n):
        words = rng.choice(12, size=20, p=rng.dirichlet(np.full(3, 0.5)) @ topics)
        docs.append({"tokens": [f"w{w}" for w in words.tolist()]})
    return docs


def write_jsonl(path: Path, records: list[dict], extra: list[bytes] = ()) -> Path:
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records) + b"".join(e + b"\n" for e in extra))
    return path


BAD = [b"{not json", b'{"x": [1]}', b"[]"]  # dead letters, at the end of every run's data


# --- fit -------------------------------------------------------------------------------------------

FITS = {
    "linreg": (lambda: regression_records(600, 4, 1), 4, []),
    "logistic": (lambda: logistic_records(1200, 6, 2), 6, []),
    "sbn": (lambda: sbn_records(300, 16, 3), 16, ["--steps", "4"]),
    "sep_bnn": (lambda: regression_records(400, 3, 4), 3, ["--steps", "3"]),
}


@pytest.mark.parametrize("family", sorted(FITS))
def test_fit_outputs_are_pinned(family, tmp_path, capsys):
    make, dim, extra = FITS[family]
    data = write_jsonl(tmp_path / "data.jsonl", make())
    code = main(["fit", "--family", family, "--dim", str(dim), "--epsilon", "1", "--seed", "11",
                 "--ledger", str(tmp_path / "ledger.jsonl"), "--out", str(tmp_path / "model.json"), *extra, str(data)])
    assert code == 0, capsys.readouterr().err
    check(f"fit-{family}", {"model": mask(json.loads((tmp_path / "model.json").read_text())),
                            "ledger": read_lines(tmp_path / "ledger.jsonl")})


# --- demo ------------------------------------------------------------------------------------------

DEMOS = {"linreg": 14_000, "logistic": 14_000, "lda": 24_000, "sbn": 12_000, "sep_bnn": 12_000}


@pytest.mark.parametrize("family", sorted(DEMOS))
def test_demo_outputs_are_pinned(family, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["demo", "--family", family, "--records", str(DEMOS[family]), "--seed", "5", "--out", str(out),
                 "--no-progress", "--metrics-port", "0"])
    assert code == 0, capsys.readouterr().err
    check(f"demo-{family}", {name: read_lines(out / f"{name}.jsonl") for name in ("models", "ledger", "dead-letters")})


# --- run on a JSONL source -------------------------------------------------------------------------

RUNS = {
    "linreg": ({"family": "linreg", "params": {"dim": 4}}, lambda: regression_records(3_000, 4, 6)),
    "logistic": ({"family": "logistic", "params": {"dim": 6}}, lambda: logistic_records(3_000, 6, 7)),
    "lda": ({"family": "lda", "params": {"vocabulary": [f"w{i}" for i in range(12)], "n_topics": 3,
                                         "doc_length": 20, "seed": 1}}, lambda: lda_records(3_000, 8)),
}


@pytest.mark.parametrize("method", ["poisson", "fixed"])
@pytest.mark.parametrize("family", sorted(RUNS))
def test_run_outputs_are_pinned(family, method, tmp_path, capsys):
    model, make = RUNS[family]
    data = write_jsonl(tmp_path / "data.jsonl", make(), BAD)
    config = {
        "model": {**model, "id": f"golden-{family}"},
        "privacy": {"epsilon": 2.0, "delta": 1e-5, "planned_steps": 10, "seed": 9,
                    "ledger": {"type": "file", "path": str(tmp_path / "ledger.jsonl")}},
        "sampling": {"method": method, "reservoir": 500, "batch_size": 100},
        "schedule": {"every_records": 250},
        "source": {"type": "jsonl", "path": str(data)},
        "sink": {"type": "jsonl", "path": str(tmp_path / "models.jsonl")},
        "dead_letter": {"type": "jsonl", "path": str(tmp_path / "dead-letters.jsonl")},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "publish_interval_s": 0.0},
    }
    (tmp_path / "config.yaml").write_text(json.dumps(config))
    code = main(["run", "--config", str(tmp_path / "config.yaml"), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    check(f"run-{family}-{method}",
          {name: read_lines(tmp_path / f"{name}.jsonl") for name in ("models", "ledger", "dead-letters")})
