"""Records/s the full pipeline consumes from Kafka as shipped, against bare consumer loops of each client library.

A single-node Apache Kafka broker (tools/kafka) serves one topic of 500,000 small linreg records
(d = 5, the shipped model) over 3 partitions, written with kcat. In every round each reader
consumes all of it, one after another, so a machine shared with other work slows a pipeline and
its peer alike; a ratio is the median over rounds of the pipeline's rate over its peer's in the
same round (``best_of_ratio``: the best rates' ratio).

**The pipelines are the two configurations a user runs, with nothing tuned for the benchmark:**

* ``k8s``: ``k8s/base/app/config.yaml`` as it is (epsilon 1 over 500 planned steps, an update per
  1,000 records, Poisson sampling from a reservoir of 10,000, full validation, a file ledger that
  prepays 5 steps per write and pays ahead, the reservoir checkpoint every 10 s, the newest model
  at most every second to a Kafka model topic, Kafka dead letters), pointed at the test broker:
  the connection (plaintext instead of SASL_SSL), the topic names, the file paths, metrics off,
  ``on_halt: exit`` and ``until_end: true`` are all that change;
* ``defaults``: every key at its default (``stream_vips/data/default.yaml``: 100 planned steps, so
  one ledger write per step) with Kafka source, model sink and dead letters. The noise is the
  default plan's calibrated z and the budget is raised to 10^4 so the 100 planned steps do not
  end the run after 100,000 records (a service is planned for its stream, not for this topic).

Each runs on kafka-python and on confluent-kafka (``client: confluent``), with the configuration's
own poll size and fetch settings.

**Peers:** a bare ``KafkaConsumer`` loop (``poll(max_records=5000)``, touching every value) for
kafka-python; for confluent-kafka a *tuned* bare loop (16 MiB ``max.partition.fetch.bytes``,
``consume(10000)``, every value decoded with ``orjson.loads``, the fastest JSON parser available
to Python), so the peer does the least work any consumer that reads the records must do; the same
loop without decoding is reported as the client's ceiling. Rates count the records after the
first polled batch over the time from that batch to the last record processed, so neither counts
connecting, joining the group or the accountant's one-time calibration; the pipeline's
end-to-end rate (``run()`` wall time) is reported too.

Both loops checksum record batches with the C ``crc32c`` package (kafka-python's ``crc32c`` extra);
``machine.kafka_python_crc32c_in_c`` records that it ran.

Targets (issue 32), on both configurations: kafka-python pipeline / bare kafka-python loop >= 0.8;
confluent pipeline / tuned bare confluent loop with orjson >= 0.5. Prints JSON and writes
benchmarks/results/bench_kafka.json.

    python benchmarks/bench_kafka.py [--records 500000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TARGET_RATIO = 0.8
#: The confluent pipeline against the tuned bare confluent loop with orjson.
TARGET_CONFLUENT_RATIO = 0.5
#: The tuned confluent peer's settings.
CONFLUENT_PARTITION_FETCH = 16 * 1024 * 1024
CONFLUENT_BATCH = 10_000
#: The shipped model's dimension (default.yaml and k8s/base/app/config.yaml).
DIM = 5
CONFIGURATIONS = ("k8s", "defaults")
CLIENTS = ("kafka-python", "confluent")


def produce_with_kcat(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    from kafka_broker import linreg_records

    with tempfile.TemporaryDirectory() as tmp:
        chunk = 200_000
        for p in range(partitions):
            path = Path(tmp) / f"p{p}.jsonl"
            with open(path, "wb") as fh:
                count = n // partitions + (1 if p < n % partitions else 0)
                for start in range(0, count, chunk):
                    fh.write(b"\n".join(linreg_records(min(chunk, count - start), dim=DIM,
                                                        seed=p * 1000 + start)) + b"\n")
            subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, "-p", str(p), "-l", "-z", "zstd",
                            "-X", "linger.ms=50", "-X", "batch.size=1000000", str(path)], check=True, timeout=600)


def bare_consumer(bootstrap: str, topic: str, n: int) -> float:
    """Records/s of a plain kafka-python loop over the whole topic."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    seen = nbytes = first = 0
    start = 0.0
    while seen < n:
        for recs in consumer.poll(timeout_ms=200, max_records=5000).values():
            for r in recs:
                nbytes += len(r.value)
            seen += len(recs)
            if not first:
                start, first = time.perf_counter(), seen
    elapsed = time.perf_counter() - start
    consumer.close()
    return (seen - first) / elapsed


def bare_confluent(bootstrap: str, topic: str, n: int, decode: bool) -> float:
    """Records/s of a tuned bare confluent-kafka loop over the whole topic (assigned partitions,
    no group, ``consume(10000)``), decoding every value with orjson when ``decode``."""
    import orjson
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-bare-{os.getpid()}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "max.partition.fetch.bytes": CONFLUENT_PARTITION_FETCH})
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(parts)])
    loads = orjson.loads
    seen = first = 0
    start = 0.0
    while seen < n:
        msgs = consumer.consume(CONFLUENT_BATCH, 0.2)
        if decode:
            for m in msgs:
                loads(m.value())
        seen += len(msgs)
        if msgs and not first:
            start, first = time.perf_counter(), seen
    elapsed = time.perf_counter() - start
    consumer.close()
    return (seen - first) / elapsed


def configuration(name: str, bootstrap: str, topic: str, tag: str, client: str, tmp: Path) -> dict:
    """The ``name`` configuration (``k8s`` or ``defaults``, module docstring) pointed at the test
    broker: only the connection, topic names, paths, metrics, ``on_halt`` and ``until_end`` differ
    from what is shipped."""
    import yaml

    from stream_vips.privacy.accountants import make_accountant
    from stream_vips.privacy.calibration import calibrate_noise_multiplier
    from stream_vips.service.build import load_config

    kafka = {"bootstrap_servers": bootstrap, "client": client}
    if name == "k8s":
        cfg = yaml.safe_load((ROOT / "k8s" / "base" / "app" / "config.yaml").read_text())
        for section in ("source", "sink", "dead_letter"):
            cfg[section] = {k: v for k, v in cfg[section].items()
                            if not k.startswith(("security_", "sasl_", "ssl_", "bootstrap_"))}
        cfg["privacy"]["ledger"]["path"] = str(tmp / f"{tag}-ledger.jsonl")
        cfg["runtime"]["checkpoint_path"] = str(tmp / f"{tag}-checkpoint.npz")
    else:
        defaults = load_config(None)
        z = calibrate_noise_multiplier(defaults.privacy.epsilon, defaults.privacy.delta,
                                       defaults.sampling.batch_size / defaults.sampling.reservoir,
                                       defaults.privacy.planned_steps, defaults.sampling.method,
                                       accountant=make_accountant("auto", defaults.sampling.method))
        cfg = {"privacy": {"epsilon": 1e4, "noise_multiplier": z,
                           "ledger": {"type": "file", "path": str(tmp / f"{tag}-ledger.jsonl")}},
               "source": {"type": "kafka"}, "sink": {"type": "kafka"}, "dead_letter": {"type": "kafka"},
               "runtime": {}}
    cfg["source"].update(kafka, topics=topic, group_id=tag, until_end=True)
    cfg["source"].pop("group_instance_id", None)
    cfg["sink"].update(kafka, topic=f"{tag}-models", create_topic=True, transactional_id=f"{tag}-models")
    cfg["dead_letter"].update(kafka, topic=f"{tag}-dlq", create_topic=True)
    cfg["metrics"] = {"enabled": False}
    cfg["runtime"].update(on_halt="exit", log_level="WARNING")
    return cfg


def pipeline(bootstrap: str, topic: str, n: int, name: str, client: str, round_no: int, tmp: Path) -> dict:
    """Consumption and end-to-end records/s of the pipeline in configuration ``name``."""
    from stream_vips.service.app import Application
    from stream_vips.service.build import config_from_dict

    tag = f"bench-{name}-{client}-{round_no}-{os.getpid()}"
    cfg = config_from_dict(configuration(name, bootstrap, topic, tag, client, tmp), env={})
    app = Application.from_config(cfg)
    marks: dict[str, float] = {}
    poll = app.source.poll

    def timed_poll(max_records: int, timeout_s: float):
        out = poll(max_records, timeout_s)
        if out and "first" not in marks:
            marks["first"], marks["first_n"] = time.perf_counter(), len(out)
        return out

    def progress(a) -> None:
        if a.stats.records >= n and "last" not in marks:
            marks["last"] = time.perf_counter()

    app.source.poll, app.progress = timed_poll, progress
    start = time.perf_counter()
    stats = app.run()
    elapsed = time.perf_counter() - start
    if stats.records != n or stats.halted:
        raise RuntimeError(f"{name}/{client}: consumed {stats.records} of {n} records, halted: {stats.halt_reason}")
    marks.setdefault("last", time.perf_counter())  # the last batch was applied while shutting down
    return {"rate": (n - marks["first_n"]) / (marks["last"] - marks["first"]), "end_to_end": n / elapsed,
            "updates": stats.updates, "published": stats.published, "rejected": sum(stats.rejected.values()),
            "ledger_steps": app.engine.monitor.steps, "prepay_steps": app.engine.monitor.prepay,
            "pay_ahead": app.engine.monitor.pay_ahead}


def paired_ratio(rates: list[float], peer_rates: list[float]) -> float:
    """The median over rounds of ``rates[r] / peer_rates[r]``.

    >>> paired_ratio([90, 80, 75], [155, 92, 90])
    0.8333333333333334
    """
    return statistics.median(a / b for a, b in zip(rates, peer_rates))


def _code_state() -> dict:
    """The commit measured and any uncommitted changes to the package or the connectors (other
    work in progress in the same tree is part of what was measured)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.rstrip("\n")

    return {"commit": git("rev-parse", "--short", "HEAD"),
            "uncommitted": git("status", "--porcelain", "--", "stream_vips", "connectors").split("\n")}


def _crc32c_in_c() -> bool:
    """Whether kafka-python checksums record batches with the C ``crc32c`` package (both loops do)."""
    from kafka.record import util

    return util.crc32c_c is not None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_kafka.json"))
    args = ap.parse_args(argv)
    code = _code_state()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import logging

    logging.basicConfig(level=logging.ERROR)
    from kafka_broker import KafkaBroker, create_topic

    peers: dict[str, list[float]] = {"kafka-python": [], "confluent": [], "confluent_no_decoding": []}
    runs: dict[tuple[str, str], list[dict]] = {(c, k): [] for c in CONFIGURATIONS for k in CLIENTS}
    with KafkaBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        topic = create_topic(broker.bootstrap, "bench-input", partitions=3)
        t0 = time.perf_counter()
        produce_with_kcat(broker.bootstrap, topic, args.records, 3)
        produce_s = time.perf_counter() - t0
        for r in range(args.rounds):
            peers["kafka-python"].append(bare_consumer(broker.bootstrap, topic, args.records))
            peers["confluent"].append(bare_confluent(broker.bootstrap, topic, args.records, decode=True))
            peers["confluent_no_decoding"].append(bare_confluent(broker.bootstrap, topic, args.records, decode=False))
            for name in CONFIGURATIONS:
                for client in CLIENTS:
                    runs[(name, client)].append(pipeline(broker.bootstrap, topic, args.records, name, client, r,
                                                         Path(tmp)))
    targets, pipelines = {}, {}
    for (name, client), rs in runs.items():
        rates = [run["rate"] for run in rs]
        peer = peers[client]
        ratio = paired_ratio(rates, peer)
        target = TARGET_RATIO if client == "kafka-python" else TARGET_CONFLUENT_RATIO
        pipelines[f"{name}/{client}"] = {
            "records_per_s": [round(x) for x in rates],
            "end_to_end_records_per_s": [round(r["end_to_end"]) for r in rs],
            **{k: rs[-1][k] for k in ("updates", "published", "rejected", "ledger_steps", "prepay_steps", "pay_ahead")}}
        targets[f"{name}/{client}_vs_bare_{client}"] = {
            "ratio": round(ratio, 3), "target": target, "met": bool(ratio >= target),
            "best_of_ratio": round(max(rates) / max(peer), 3)}
    result = {
        "benchmark": "bench_kafka",
        "records": args.records,
        "partitions": 3,
        "rounds": args.rounds,
        "produce_seconds_kcat": round(produce_s, 2),
        "configurations": {
            "k8s": "k8s/base/app/config.yaml as shipped (file ledger, prepay 5, pay ahead, checkpoint every 10 s), "
                   "plaintext connection to the test broker, fresh topics and paths, metrics off",
            "defaults": "every key at its default (planned_steps 100: prepay 1, pay ahead) with Kafka source, sink "
                        "and dead letters; z calibrated for the default plan, budget 1e4 so the plan does not end "
                        "the run"},
        "peer": {
            "kafka-python": "bare kafka-python KafkaConsumer poll loop (poll(max_records=5000), every value touched)",
            "confluent": (f"tuned bare confluent-kafka loop: max.partition.fetch.bytes {CONFLUENT_PARTITION_FETCH}, "
                          f"consume({CONFLUENT_BATCH}), orjson.loads on every value, read_committed"),
            "why_fair": ("the same topic, broker, client library and rate definition in the same round; each peer does "
                         "the least work a reader of the records must do (read, or parse with the fastest parser) "
                         "and nothing else (no group, commits, validation, reservoir or updates), while the "
                         "pipelines run the shipped configurations untuned"),
        },
        "rate": "records after the first polled batch / seconds from that batch to the last record processed",
        "ratio": "median over rounds of pipeline / peer in the same round",
        "peer_records_per_s": {k: [round(x) for x in v] for k, v in peers.items()},
        "pipelines": pipelines,
        "targets": targets,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "kafka_python_crc32c_in_c": _crc32c_in_c(), "load_avg_1m": os.getloadavg()[0]},
        "code": code,
    }
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
