"""A pod restarted after SIGKILL, on the real broker: the identities that the manifests give it
(k8s/base/app/statefulset.yaml and config.yaml) make the restart cheap.

- Static group membership: a consumer that comes back under the same ``group_instance_id`` (the
  pod name) gets its partitions back at once, while a dynamic member waits for the dead one's
  session to expire. Each member is a separate process running
  :class:`connectors.kafka.KafkaSource` (as the pipeline does), killed with SIGKILL: no
  LeaveGroup, no commit, what a crashed or OOM-killed pod does. The time measured is from the new
  process's ``KafkaSource(...)`` to its first records.
- A fixed ``transactional_id``: a publisher killed inside a transaction leaves it open, and
  read-committed readers of the model topic see nothing past it until it is aborted. The
  restarted :class:`connectors.kafka.KafkaModelSink` under the same id aborts it when it starts;
  under a fresh (random) id readers wait for the broker's transaction timeout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kafka_broker import CLIENTS, create_topic, linreg_records, produce, unique_topic

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[1]
SESSION_TIMEOUT_MS = 10_000  # the broker's minimum is 6 s; the pipeline's default is 45 s
REJOIN_LIMIT_S = 5.0

MEMBER = r"""
import json, sys, time
from connectors.kafka import KafkaSource

bootstrap, topic, group, instance, session_ms, client = sys.argv[1:7]
t0 = time.monotonic()
source = KafkaSource(bootstrap, topic, group_id=group, group_instance_id=instance or None,
                     session_timeout_ms=int(session_ms), heartbeat_interval_ms=1000, client=client)
while True:
    records = source.poll(500, 0.2)
    if records:
        print(json.dumps({"first_records_s": time.monotonic() - t0, "n": len(records)}), flush=True)
        break
deadline = time.monotonic() + 120  # stay a member until killed (bounded)
while time.monotonic() < deadline:
    source.poll(500, 0.5)
"""


def _start(bootstrap: str, topic: str, group: str, instance: str | None, client: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", MEMBER, bootstrap, topic, group, instance or "", str(SESSION_TIMEOUT_MS), client],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=ROOT)


def _first_records_s(proc: subprocess.Popen[str], timeout_s: float = 90.0) -> float:
    """Seconds from the member's KafkaSource(...) to its first records (it prints one JSON line)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    if not sel.select(timeout_s):
        proc.kill()
        pytest.fail(f"member printed nothing within {timeout_s} s")
    line = proc.stdout.readline()
    assert line, f"member exited with {proc.wait()} before reading a record"
    return json.loads(line)["first_records_s"]


def _crash_and_rejoin(bootstrap: str, instance: str | None, client: str = "kafka-python") -> float:
    """Start a member, let it consume, SIGKILL it, start its replacement; the replacement's rejoin time."""
    topic = create_topic(bootstrap, unique_topic("static-membership"), partitions=2)
    produce(bootstrap, topic, linreg_records(2000), partitions=2)
    group = unique_topic("static-group")
    first = _start(bootstrap, topic, group, instance, client)
    second = None
    try:
        _first_records_s(first)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
        second = _start(bootstrap, topic, group, instance, client)
        return _first_records_s(second)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(timeout=10)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_sigkilled_static_member_rejoins_in_under_5_s(kafka_bootstrap, client):
    rejoin = _crash_and_rejoin(kafka_bootstrap, instance="stream-vips-0", client=client)
    assert rejoin < REJOIN_LIMIT_S, f"static member took {rejoin:.1f} s to get its partitions back"


def test_without_static_membership_the_replacement_waits_for_the_dead_session(kafka_bootstrap):
    """The control: the same crash with a dynamic member waits about a session timeout, so the
    5 s bound above measures static membership and not a fast machine."""
    rejoin = _crash_and_rejoin(kafka_bootstrap, instance=None)
    assert rejoin >= REJOIN_LIMIT_S, f"dynamic member rejoined in {rejoin:.1f} s: the control shows nothing"
    assert rejoin < SESSION_TIMEOUT_MS / 1000 + 20


# ---------------------------------------------------------------------------------------------
# fixed transactional id

TRANSACTION_TIMEOUT_MS = 15_000  # the crashed publisher's; Kafka's default is 60 s

CRASHED_PUBLISHER = r"""
import sys, time
from kafka import KafkaProducer

bootstrap, topic, tid, timeout_ms = sys.argv[1:5]
producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=tid, enable_idempotence=True,
                         acks="all", transaction_timeout_ms=int(timeout_ms))
producer.init_transactions()
producer.begin_transaction()
producer.send(topic, key=b"model", value=b"never committed", partition=0)
producer.flush()
print("open", flush=True)
time.sleep(120)  # killed here, inside the transaction
"""


def _publish_after_a_crashed_transaction(bootstrap: str, transactional_id: str | None,
                                         client: str = "kafka-python") -> tuple[float, list[bytes]]:
    """SIGKILL a publisher inside a transaction, start a model sink (``transactional_id`` None: the
    sink's random default), publish; seconds until a read-committed reader has the new model."""
    from kafka import KafkaConsumer, TopicPartition

    from connectors.kafka import KafkaModelSink

    topic = create_topic(bootstrap, unique_topic("restart-models"),
                         configs={"cleanup.policy": "compact", "max.message.bytes": "1048576"})
    tid = unique_topic("stream-vips-0-models")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    crashed = subprocess.Popen([sys.executable, "-c", CRASHED_PUBLISHER, bootstrap, topic, tid,
                                str(TRANSACTION_TIMEOUT_MS)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               text=True, env=env)
    try:
        assert crashed.stdout.readline().strip() == "open"
    finally:
        crashed.kill()
        crashed.wait(timeout=10)
    t0 = time.monotonic()
    sink = KafkaModelSink(bootstrap, topic=topic, create_topic=False,
                          transactional_id=tid if transactional_id else None, client=client)
    try:
        sink.publish("model", {"model_id": "model", "version": 1})
    finally:
        sink.close()
    reader = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed",
                           enable_auto_commit=False, auto_offset_reset="earliest")
    reader.assign([TopicPartition(topic, 0)])
    seen: list[bytes] = []
    try:
        while time.monotonic() - t0 < TRANSACTION_TIMEOUT_MS / 1000 + 60:
            for records in reader.poll(timeout_ms=200).values():
                seen += [r.value for r in records]
            if any(b'"version":1' in v for v in seen):
                return time.monotonic() - t0, seen
    finally:
        reader.close()
    pytest.fail(f"the new model never became readable; read {seen}")


@pytest.mark.parametrize("client", CLIENTS)
def test_a_fixed_transactional_id_unblocks_readers_at_restart(kafka_bootstrap, client):
    waited, seen = _publish_after_a_crashed_transaction(kafka_bootstrap, transactional_id="fixed", client=client)
    assert b"never committed" not in seen, "an aborted transaction's record reached a read-committed reader"
    assert waited < REJOIN_LIMIT_S, f"readers waited {waited:.1f} s for the restarted publisher's model"


def test_with_a_random_transactional_id_readers_wait_for_the_transaction_timeout(kafka_bootstrap):
    """The control: the sink's random default leaves the crashed transaction to time out."""
    waited, seen = _publish_after_a_crashed_transaction(kafka_bootstrap, transactional_id=None)
    assert b"never committed" not in seen
    assert waited >= REJOIN_LIMIT_S, f"readers got the model after {waited:.1f} s: the control shows nothing"
