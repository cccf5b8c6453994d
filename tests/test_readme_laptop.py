"""The README's Kafka walkthrough runs as written, and its Kafka configuration starts on one broker."""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kafka_broker import BrokerError, broker_mod, in_ci, unique_topic

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LAPTOP = ROOT / "examples" / "laptop.yaml"
#: The configuration sections that name a Kafka bootstrap address, as environment overrides.
KAFKA_SECTIONS = ("SOURCE", "SINK", "DEAD_LETTER", "PRIVACY__LEDGER__OPTIONS")


def laptop_block() -> str:
    (block,) = re.findall(r"<!-- laptop -->\n```bash\n(.*?)```", README, flags=re.S)
    return block


def overrides(bootstrap: str) -> dict[str, str]:
    """What the README says to set to point the configuration at another address."""
    return {f"STREAM_VIPS__{section}__BOOTSTRAP_SERVERS": bootstrap for section in KAFKA_SECTIONS}


def test_the_readme_shows_the_laptop_configuration_and_its_address():
    shown = re.search(r"`examples/laptop\.yaml`:\n\n```yaml\n(.*?)```", README, flags=re.S).group(1)
    text = LAPTOP.read_text()
    assert shown == "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    config = yaml.safe_load(text)
    addresses = {config[s]["bootstrap_servers"] for s in ("source", "sink", "dead_letter")}
    addresses.add(config["privacy"]["ledger"]["options"]["bootstrap_servers"])
    assert addresses == {"127.0.0.1:9092"} and "PORT=${PORT:-9092}" in laptop_block()
    for section in KAFKA_SECTIONS:  # the README names every override a port other than 9092 needs
        assert f"`{section}`" in README or f"STREAM_VIPS__{section}__BOOTSTRAP_SERVERS" in README


def _needed(what: str, ok: bool) -> None:
    if not ok:
        if in_ci():
            pytest.fail(f"{what} is missing under CI", pytrace=False)
        pytest.skip(f"{what} is missing")


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.kafka
def test_the_laptop_walkthrough_runs_as_written_and_leaves_nothing_running():
    """The five commands, on a broker the block starts itself at a free port (the block's PORT,
    the configuration pointed there as the README says): every step succeeds, the model is
    readable, and the broker is gone afterwards."""
    try:
        broker_mod.classpath()
        broker_mod.java()
    except BrokerError as exc:
        _needed(f"the Kafka broker ({exc})", False)
    _needed("kcat", shutil.which("kcat") is not None)
    _needed("the stream-vips command", shutil.which("stream-vips") is not None)
    port = broker_mod.free_port()
    env = {**os.environ, **overrides(f"127.0.0.1:{port}"), "PORT": str(port),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    before = set(os.listdir(ROOT))
    started = time.monotonic()
    proc = subprocess.Popen(["bash", "-e", "-c", laptop_block()], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        _stop_group(proc)
    took = time.monotonic() - started
    assert proc.returncode == 0, f"the block failed ({proc.returncode}) after {took:.0f}s:\n{out}\n{err[-4000:]}"
    for topic in ("laptop-records", "laptop-models", "laptop-dead-letters", "laptop-ledger"):
        assert re.search(rf"^{topic} \(.*\): created", out, flags=re.M), out
    assert "laptop-ledger (privacy ledger): replication 1 (instead of 3)" in out
    assert "allow_weak_durability: true" in err  # the ledger's WARNING on what one broker weakens
    versions = [int(v) for v in re.findall(r"^model laptop .* version (\d+) ", out, flags=re.M)]
    assert versions and versions[0] >= 0, out
    assert re.search(r"^records +1000 ", err, flags=re.M)  # the run's summary: every record read
    assert not _listening(port), "the broker still serves after the block"
    assert set(os.listdir(ROOT)) - before <= {"__pycache__", ".pytest_cache"}


def _stop_group(proc: subprocess.Popen) -> None:
    """Assert the block's process group is empty; if not (a failed block leaves the broker
    running), stop it (SIGTERM lets tools/kafka/broker.py stop its JVM) and fail."""
    leftover = False
    deadline = time.monotonic() + 30
    while True:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        leftover = True
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        os.killpg(proc.pid, signal.SIGTERM)
        time.sleep(1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    assert not leftover, "the block left processes running"


@pytest.mark.kafka
def test_the_readme_kafka_configuration_starts_on_one_broker(kafka_bootstrap, caplog):
    """'Running on your own stream' as written, pointed at the one test broker (with unique
    names so it shares the broker with other tests): it starts, and the ledger says what one
    broker weakens."""
    from kafka import KafkaAdminClient

    from stream_vips.service.app import Application
    from stream_vips.service.build import config_from_dict

    section = README[README.index("## Running on your own stream"):]
    data = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1))
    ledger_topic = unique_topic("readme-ledger")
    env = {**overrides(kafka_bootstrap), "STREAM_VIPS__PRIVACY__LEDGER__OPTIONS__TOPIC": ledger_topic,
           "STREAM_VIPS__PRIVACY__LEDGER__OPTIONS__NAME": unique_topic("churn"),
           "STREAM_VIPS__SOURCE__TOPICS": unique_topic("events"),
           "STREAM_VIPS__SOURCE__GROUP_ID": unique_topic("readme"),
           "STREAM_VIPS__SINK__TOPIC": unique_topic("readme-models"),
           "STREAM_VIPS__SINK__TRANSACTIONAL_ID": unique_topic("readme-models"),
           "STREAM_VIPS__DEAD_LETTER__TOPIC": unique_topic("readme-dead-letters"),
           "STREAM_VIPS__RUNTIME__CHECKPOINT_PATH": "null", "STREAM_VIPS__METRICS__ENABLED": "false"}
    with caplog.at_level(logging.WARNING, logger="connectors.kafka"):
        app = Application.from_config(config_from_dict(data, env=env))
    try:
        assert any("allow_weak_durability: true" in r.getMessage() and "replication 1 (instead of 3)" in r.getMessage()
                   for r in caplog.records)
        admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        try:
            (described,) = admin.describe_topics([ledger_topic])
        finally:
            admin.close()
        assert [len(p["replica_nodes"]) for p in described["partitions"]] == [1]
    finally:
        app.stop()
        app.run()  # returns at once and closes the connectors and the ledger
