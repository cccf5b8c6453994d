"""Records/s the full pipeline consumes from Kafka, against a bare kafka-python consumer loop.

A single-node Apache Kafka broker (tools/kafka) serves one topic of 1,000,000 small linreg records
over 3 partitions (written with kcat). Two readers consume all of it, alternately, ``--rounds``
times each, and the best round of each counts:

* peer: a bare ``KafkaConsumer`` loop (``poll(max_records=5000)``, touching every value);
* (diagnosis only) ``KafkaSource`` alone, to separate the connector's cost from the core's;
* pipeline: ``Application`` from a Kafka-to-Kafka configuration (KafkaSource with a consumer
  group and synchronous commits at most every ``commit_interval_s`` = 1 s, JSON decoding and validation, reservoir, private updates every
  ``--every`` records with the Kafka ledger and the Kafka model sink).

Target: pipeline / peer >= 0.8. Prints JSON and writes benchmarks/results/bench_kafka.json.

    python benchmarks/bench_kafka.py [--records 1000000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TARGET_RATIO = 0.8


def produce_with_kcat(bootstrap: str, topic: str, n: int, partitions: int) -> None:
    from kafka_broker import linreg_records

    with tempfile.TemporaryDirectory() as tmp:
        chunk = 200_000
        for p in range(partitions):
            path = Path(tmp) / f"p{p}.jsonl"
            with open(path, "wb") as fh:
                count = n // partitions + (1 if p < n % partitions else 0)
                for start in range(0, count, chunk):
                    fh.write(b"\n".join(linreg_records(min(chunk, count - start), seed=p * 1000 + start)) + b"\n")
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
    seen = nbytes = 0
    start = time.perf_counter()
    while seen < n:
        for recs in consumer.poll(timeout_ms=200, max_records=5000).values():
            for r in recs:
                nbytes += len(r.value)
            seen += len(recs)
    elapsed = time.perf_counter() - start
    consumer.close()
    return seen / elapsed


def source_only(bootstrap: str, topic: str, n: int, round_no: int) -> float:
    """Records/s of KafkaSource alone (consumer group, RawRecords, ``commit()`` per poll): the
    connector's share of the pipeline's cost, reported for diagnosis (not a target)."""
    from connectors.kafka import KafkaSource

    src = KafkaSource(bootstrap, topic, group_id=f"bench-src-{round_no}-{os.getpid()}", until_end=True)
    seen = 0
    start = time.perf_counter()
    while not src.exhausted:
        seen += len(src.poll(5000, 0.2))
        src.commit()
    elapsed = time.perf_counter() - start
    src.close()
    if seen != n:
        raise RuntimeError(f"source consumed {seen} records, expected {n}")
    return seen / elapsed


def pipeline(bootstrap: str, topic: str, n: int, every: int, round_no: int) -> tuple[float, dict]:
    """Records/s of the full pipeline over the whole topic (a fresh consumer group each round)."""
    from kafka_broker import build_app, pipeline_config

    tag = f"bench-{round_no}-{os.getpid()}"
    cfg = pipeline_config(bootstrap, input_topic=topic, model_topic=f"{tag}-models", dead_letter_topic=f"{tag}-dlq",
                          group_id=tag, reservoir=10_000, batch_size=1000, every_records=every,
                          noise_multiplier=2.0, epsilon=5.0, source_options={"until_end": True})
    app = build_app({"config": cfg, "ledger_topic": f"{tag}-ledger", "ledger_id": tag})
    start = time.perf_counter()
    stats = app.run()
    elapsed = time.perf_counter() - start
    if stats.records != n:
        raise RuntimeError(f"pipeline consumed {stats.records} records, expected {n}")
    return stats.records / elapsed, {"updates": stats.updates, "rejected": sum(stats.rejected.values())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--every", type=int, default=50_000, help="records between private updates")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "bench_kafka.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import logging

    logging.basicConfig(level=logging.ERROR)
    from kafka_broker import KafkaBroker, create_topic

    with KafkaBroker() as broker:
        topic = create_topic(broker.bootstrap, "bench-input", partitions=3)
        t0 = time.perf_counter()
        produce_with_kcat(broker.bootstrap, topic, args.records, 3)
        produce_s = time.perf_counter() - t0
        peer_rates, pipe_rates, src_rates, pipe_info = [], [], [], {}
        for r in range(args.rounds):
            peer_rates.append(bare_consumer(broker.bootstrap, topic, args.records))
            src_rates.append(source_only(broker.bootstrap, topic, args.records, r))
            rate, pipe_info = pipeline(broker.bootstrap, topic, args.records, args.every, r)
            pipe_rates.append(rate)
    peer, pipe = max(peer_rates), max(pipe_rates)
    ratio = pipe / peer
    result = {
        "benchmark": "bench_kafka",
        "records": args.records,
        "partitions": 3,
        "rounds": args.rounds,
        "produce_seconds_kcat": round(produce_s, 2),
        "peer": "bare kafka-python KafkaConsumer poll loop",
        "peer_records_per_s": [round(x) for x in peer_rates],
        "pipeline_records_per_s": [round(x) for x in pipe_rates],
        "pipeline": {"every_records": args.every, **pipe_info},
        "diagnosis": {"kafka_source_only_records_per_s": [round(x) for x in src_rates],
                      "kafka_source_only_vs_bare": round(max(src_rates) / peer, 3)},
        "targets": {
            "pipeline_vs_bare_consumer": {"ratio": round(ratio, 3), "target": TARGET_RATIO,
                                          "met": bool(ratio >= TARGET_RATIO)},
        },
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_avg_1m": os.getloadavg()[0]},
    }
    text = json.dumps(result, indent=2)
    print(text)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
