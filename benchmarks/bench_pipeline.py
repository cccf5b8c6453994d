"""Benchmark: embedded pipeline throughput against a bare JSON-decoding loop over the same lines.

The pipeline run is the real one (``Application.run`` with in-memory connectors): poll, decode,
validate and preprocess (linreg, d = 10, 1% malformed records to the dead-letter sink), reservoir
(Algorithm R, M = 10000), an update every 1000 arrivals (q = 0.1: budget check, ledger append,
noise, M-step, the epsilon report, message build and publish). Two peers, each a loop that only
decodes every line (every value is materialised as a Python object; errors caught): the least
any consumer must do. ``json.loads`` is the peer the target is set against (>= 0.5; it stays so
until the per-record path is rebuilt); ``orjson.loads`` is the honest peer (the pipeline decodes
with orjson too), reported without a target. Each case runs on a clean stream and on the same
stream with 1% malformed records. All runs see the same lines in the same process, interleaved;
rates use the fastest of ``REPEATS`` runs and min/median/max seconds are reported. The machine is
a shared 2-core box: the load average before and after the run is recorded.

Every message reports the epsilon of the ledger after its step: microseconds with RDP
(fixed-size sampling); with PLD (Poisson) one evaluation per grid point of counts the ledger
crosses (every step up to 256 steps, then 1/256 apart), about a millisecond here on a grid that
follows epsilon (it was ~45-60 ms per message with a fresh n-fold self-composition on a fixed
1e-4 grid). The first case is the default configuration: PLD with
``runtime.publish_interval_s: 1`` (the newest model at most once a second, plus the last one);
the other two publish a message per update. Besides each case against the bare loop, the
PLD message-per-update pipeline is compared with the same pipeline publishing once a second
(target >= 0.5: epsilon in every message must not dominate the cost). Earlier results are kept
in ``history``.

Start-up (calibration, the budget monitor's first headroom search) is excluded: a warm-up run
over a short stream goes first with the same budget monitor and accountant, which the timed runs
keep using (their steps continue the same ledger), so they measure the steady state of a
long-running consumer. Budget is set so that no run halts.

Run: ``python benchmarks/bench_pipeline.py`` (writes benchmarks/results/bench_pipeline.json).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import RESULTS, machine, write_result  # noqa: E402
from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource  # noqa: E402
from connectors.synthetic import SyntheticRegressionSource  # noqa: E402
from stream_vips.config import config_from_dict  # noqa: E402
from stream_vips.pipeline import Application  # noqa: E402
from stream_vips.privacy.accountant import Accountant, make_accountant  # noqa: E402
from stream_vips.privacy.budget import BudgetMonitor  # noqa: E402
from stream_vips.privacy.ledger import MemoryLedger  # noqa: E402

RECORDS = 100_000
DIM = 10
REPEATS = 5
TARGET_RATIO = 0.5
MALFORMED = 0.01


def config(method: str, publish_interval_s: float = 0.0) -> dict:
    return {
        "model": {"family": "linreg", "params": {"dim": DIM}},
        "privacy": {"epsilon": 1e3, "delta": 1e-5, "noise_multiplier": 2.0, "seed": 0, "ledger": {"type": "memory"}},
        "sampling": {"method": method, "reservoir": 10_000, "batch_size": 1_000},
        "schedule": {"every_records": 1_000},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 5_000, "poll_timeout_s": 0.0, "blas_threads": 1,
                    "publish_interval_s": publish_interval_s},
    }


def bare_decode(lines: list[bytes], loads=json.loads) -> float:
    """Seconds to decode every line with ``loads`` (errors caught, as any consumer must)."""
    t = time.perf_counter()
    for line in lines:
        try:
            loads(line)
        except ValueError:
            pass
    return time.perf_counter() - t


def spread(seconds: list[float]) -> dict:
    return {"min": min(seconds), "median": statistics.median(seconds), "max": max(seconds), "runs": seconds}


def pipeline(lines: list[bytes], method: str, accountant: Accountant, shared: dict,
             publish_interval_s: float = 0.0) -> tuple[float, dict]:
    """Seconds for Application.run over ``lines`` (construction excluded) and its counters."""
    sink = MemorySink()
    app = Application.from_config(config_from_dict(config(method, publish_interval_s), env={}),
                                  source=MemorySource(lines),
                                  sink=sink, dead_letter=MemoryDeadLetterSink(), ledger=MemoryLedger())
    # One budget monitor (and accountant) per case, shared by its runs: its one-off headroom
    # search and the accountant's caches are start-up, not throughput.
    if "monitor" not in shared:
        built = app.engine.monitor
        shared["monitor"] = BudgetMonitor(built.epsilon_budget, built.delta, accountant, built.ledger)
    app.engine.monitor = shared["monitor"]
    t = time.perf_counter()
    stats = app.run()
    elapsed = time.perf_counter() - t
    return elapsed, {"records": stats.records, "accepted": stats.accepted, "updates": stats.updates,
                     "messages": len(sink.messages), "rejected": sum(stats.rejected.values()),
                     "halted": stats.halted}


def case(name: str, lines: list[bytes], method: str, repeats: int, publish_interval_s: float = 0.0) -> dict:
    import orjson

    accountant, shared = make_accountant("auto", method), {}
    pipeline(lines[:20_000], method, accountant, shared, publish_interval_s)  # warm-up: caches, imports, BLAS
    json_s, orjson_s, pipe_s, counters = [], [], [], {}
    for _ in range(repeats):
        json_s.append(bare_decode(lines, json.loads))
        orjson_s.append(bare_decode(lines, orjson.loads))
        elapsed, counters = pipeline(lines, method, accountant, shared, publish_interval_s)
        pipe_s.append(elapsed)
    pipe_rate = len(lines) / min(pipe_s)
    json_rate, orjson_rate = len(lines) / min(json_s), len(lines) / min(orjson_s)
    ratio = pipe_rate / json_rate
    return {
        "case": name,
        "sampling": method,
        "accountant": accountant.name,
        "publish_interval_s": publish_interval_s,
        "pipeline": {"records_per_s": pipe_rate, "seconds": spread(pipe_s), **counters,
                     "seconds_per_update": min(pipe_s) / max(counters["updates"], 1)},
        "peer": {"name": "bare loop: json.loads per line", "records_per_s": json_rate, "seconds": spread(json_s)},
        "orjson_peer": {"name": "bare loop: orjson.loads per line", "records_per_s": orjson_rate,
                        "seconds": spread(orjson_s)},
        "throughput_ratio": {"value": ratio, "target": f">= {TARGET_RATIO}", "met": bool(ratio >= TARGET_RATIO),
                             "what": "pipeline records/s over the json.loads loop's"},
        "throughput_ratio_vs_orjson": {
            "value": pipe_rate / orjson_rate, "target": None, "met": None,
            "what": "pipeline records/s over the orjson.loads loop's; reported without a target (the >= 0.5 "
                    "target is against the json.loads loop until the per-record path is rebuilt)"},
    }


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def main() -> dict:
    load_before = load_average()
    malformed = SyntheticRegressionSource(count=RECORDS, dimension=DIM, seed=1,
                                          malformed_fraction=MALFORMED).generate(RECORDS)
    clean = SyntheticRegressionSource(count=RECORDS, dimension=DIM, seed=1, malformed_fraction=0.0).generate(RECORDS)
    cases = []
    for stream, lines in (("1% malformed", malformed), ("clean", clean)):
        for name, method, interval in (
                ("default configuration: poisson/PLD, newest model at most once a second", "poisson", 1.0),
                ("fixed/autodp, a message per update", "fixed", 0.0),
                ("poisson/PLD, a message per update (PLD epsilon in every message)", "poisson", 0.0)):
            cases.append({"stream": stream, **case(name, lines, method, REPEATS, publish_interval_s=interval)})
    result = {
        "benchmark": "bench_pipeline",
        "machine": {**machine(), "load_average_1_5_15_min": {"before": load_before, "after": load_average()},
                    "note": "shared 2-core box; other jobs ran at the same time, so compare ratios measured "
                            "in the same run (interleaved) rather than absolute rates across runs"},
        "workload": {"records": RECORDS, "dim": DIM, "streams": {"1% malformed": MALFORMED, "clean": 0.0},
                     "repeats": REPEATS, "config": config("<method>")},
        "cases": cases,
    }
    default, per_update = cases[0], cases[2]
    ratio = per_update["pipeline"]["records_per_s"] / default["pipeline"]["records_per_s"]
    result["message_per_update_vs_once_a_second"] = {
        "value": ratio, "target": f">= {TARGET_RATIO}", "met": bool(ratio >= TARGET_RATIO),
        "what": "records/s of poisson/PLD publishing every update over the same pipeline publishing once a "
                "second (1% malformed stream)",
    }
    summary = {c["stream"] + ": " + c["case"]: {
        "vs_json": round(c["throughput_ratio"]["value"], 3), "vs_orjson": round(c["throughput_ratio_vs_orjson"]["value"], 3)}
        for c in cases}
    by = {(c["stream"], c["case"]): c["pipeline"]["records_per_s"] for c in cases}
    result["summary"] = {"ratios": summary, "clean_over_malformed_records_per_s": {
        name: round(by[("clean", name)] / by[("1% malformed", name)], 3) for _, name in by}}
    path = RESULTS / "bench_pipeline.json"
    previous = json.loads(path.read_text()) if path.exists() else None
    history = previous.pop("history", []) if previous else []
    if previous:
        previous.setdefault("label", os.environ.get("BENCH_PREVIOUS_LABEL", "earlier run"))
        history.insert(0, previous)
    result["history"] = history
    write_result("bench_pipeline", result)
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
