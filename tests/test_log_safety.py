"""No record bytes in any log at DEBUG: canary records through a real broker, in process and via the CLI;
the client's floor follows the run's level, and credentials are redacted even with the unsafe switch.

Two canaries go through a Kafka-to-Kafka pipeline with everything logged at DEBUG: a valid
record whose x holds an unusual float, and a malformed record holding a marker string (it is
rejected to the dead-letter topic). Neither may appear in the captured log text (every logger,
level DEBUG), the metrics exposition, the published model messages or the ledger file. The
controls run the same harness with the guard switched off (``STREAM_VIPS_UNSAFE_CLIENT_DEBUG=1``)
and must find the canaries in the Kafka client's log lines, so the main assertions can fail.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.kafka import read_topic
from kafka_broker import create_topic, linreg_records, produce, unique_topic
from stream_vips import logsafety

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[1]

CANARY_FLOAT = 0.123456789012
CANARY_DIGITS = "123456789012"  # how the float shows in any repr or JSON of the record
CANARY_TEXT = f"CANARY{uuid.uuid4().hex[:12]}"
N_GOOD = 400


def _canary_values() -> list[bytes]:
    """Public test records with the two canaries in the middle."""
    good = linreg_records(N_GOOD, seed=11)
    valid = json.dumps({"x": [CANARY_FLOAT, 0.1, -0.2, 0.3], "y": 0.25}).encode()
    malformed = ('{"x": "' + CANARY_TEXT + '", "y": ').encode()  # invalid JSON -> dead letter
    return good[:150] + [valid, malformed] + good[150:]


def _found(text: str | bytes) -> list[str]:
    """The canaries present in ``text``."""
    s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    return [c for c in (CANARY_DIGITS, CANARY_TEXT) if c in s]


def _config(bootstrap: str, tmp: Path) -> dict[str, Any]:
    """A small linreg pipeline over fresh topics: Kafka source, model sink and dead letters, file ledger."""
    names = {k: unique_topic(f"ls-{k}") for k in ("in", "models", "dlq", "g")}
    create_topic(bootstrap, names["in"])
    produce(bootstrap, names["in"], _canary_values())
    return {
        "model": {"family": "linreg", "id": "canary", "params": {"dim": 4}},
        "privacy": {"epsilon": 5.0, "delta": 1e-5, "planned_steps": 20, "noise_multiplier": 2.0,
                    "ledger": {"type": "file", "path": str(tmp / "ledger.jsonl")}},
        "sampling": {"method": "poisson", "reservoir": 200, "batch_size": 50},
        "schedule": {"every_records": 200},
        "source": {"type": "kafka", "bootstrap_servers": bootstrap, "topics": names["in"],
                   "group_id": names["g"], "until_end": True},
        "sink": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": names["models"],
                 "transactional_id": f"{names['g']}-models"},
        "dead_letter": {"type": "kafka", "bootstrap_servers": bootstrap, "topic": names["dlq"]},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 500, "poll_timeout_s": 0.2, "publish_interval_s": 0.0},
    }


def _outputs(bootstrap: str, cfg: dict[str, Any]) -> tuple[bytes, bytes, bytes]:
    """Model topic values, ledger file and dead-letter topic values of a finished run."""
    models = b"\n".join(r.value for r in read_topic(bootstrap, cfg["sink"]["topic"]))
    letters = b"\n".join(r.value for r in read_topic(bootstrap, cfg["dead_letter"]["topic"]))
    return models, Path(cfg["privacy"]["ledger"]["path"]).read_bytes(), letters


class _Capture(logging.Handler):
    """Every record of every logger, formatted with its logger name (and traceback, if any)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.name, self.format(record)))


@pytest.fixture
def debug_logging() -> Iterator[_Capture]:
    """Root logger at DEBUG with a capturing handler; the client's logger state is put back afterwards."""
    root = logging.getLogger()
    saved_root = root.level
    client = {n: (lg.level, list(lg.filters)) for n, lg in logging.root.manager.loggerDict.items()
              if isinstance(lg, logging.Logger) and (n == "kafka" or n.startswith("kafka."))}
    capture = _Capture()
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        root.setLevel(saved_root)
        for name, lg in list(logging.root.manager.loggerDict.items()):
            if isinstance(lg, logging.Logger) and (name == "kafka" or name.startswith("kafka.")):
                level, filters = client.get(name, (logging.NOTSET, []))
                lg.setLevel(level)
                lg.filters[:] = filters


def _run_in_process(bootstrap: str, tmp: Path, capture: _Capture) -> tuple[Any, Any, dict[str, Any]]:
    """Build (this is where the library installs the guard) and run the pipeline; ``capture``
    holds what the pipeline logged, not the test's own producer."""
    from stream_vips.service.app import Application
    from stream_vips.service.build import config_from_dict

    cfg = _config(bootstrap, tmp)
    capture.lines.clear()
    app = Application.from_config(config_from_dict(cfg, env={}))
    return app, app.run(), cfg


def test_guarded_debug_run_leaks_no_canary(kafka_bootstrap, tmp_path, debug_logging, monkeypatch):
    monkeypatch.delenv(logsafety.UNSAFE_ENV, raising=False)
    app, stats, cfg = _run_in_process(kafka_bootstrap, tmp_path, debug_logging)
    # the canaries were really consumed: one accepted, one rejected to the dead-letter topic
    assert stats.records == N_GOOD + 2 and stats.accepted == N_GOOD + 1 and stats.updates >= 1
    # the root was at DEBUG, yet only INFO and above of the client got through
    client_lines = [line for name, line in debug_logging.lines if name.startswith("kafka")]
    assert client_lines and not any(line.startswith("DEBUG") for line in client_lines)
    text = "\n".join(line for _, line in debug_logging.lines)
    models, ledger, letters = _outputs(kafka_bootstrap, cfg)
    assert CANARY_TEXT.encode() in letters  # where a rejected record belongs
    assert models and ledger
    assert _found(text) == [], [line[:300] for _, line in debug_logging.lines if _found(line)][:5]
    assert _found(app.metrics.exposition()) == []
    assert _found(models) == []
    assert _found(ledger) == []


def test_control_unguarded_debug_run_logs_the_canaries(kafka_bootstrap, tmp_path, debug_logging, monkeypatch):
    """The harness can see a leak: with the unsafe opt-out the client's DEBUG lines carry the record bytes."""
    monkeypatch.setenv(logsafety.UNSAFE_ENV, "1")
    assert logsafety.guard_client_logging() is False
    _, stats, _ = _run_in_process(kafka_bootstrap, tmp_path, debug_logging)
    assert stats.records == N_GOOD + 2
    leaking = {name for name, line in debug_logging.lines if _found(line)}
    assert leaking and all(name.startswith("kafka.") for name in leaking), leaking
    found = set().union(*(_found(line) for _, line in debug_logging.lines))
    assert found == {CANARY_DIGITS, CANARY_TEXT}


def _run_cli(bootstrap: str, tmp: Path, unsafe: bool) -> tuple[subprocess.CompletedProcess, dict[str, Any]]:
    cfg = _config(bootstrap, tmp)
    path = tmp / "config.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_VIPS")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    if unsafe:
        env[logsafety.UNSAFE_ENV] = "1"
    proc = subprocess.run([sys.executable, "-m", "stream_vips.cli", "run", "--config", str(path),
                           "--log-level", "DEBUG"], cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{N_GOOD + 2} records (1 rejected)" in proc.stderr, proc.stderr[-2000:]
    return proc, cfg


@pytest.mark.parametrize("unsafe", [False, True], ids=["guarded", "control-unguarded"])
def test_cli_run_at_debug(kafka_bootstrap, tmp_path, unsafe):
    proc, cfg = _run_cli(kafka_bootstrap, tmp_path, unsafe)
    if unsafe:  # the control: the same run without the guard does leak, through the client's loggers
        assert " DEBUG kafka." in proc.stderr  # --log-level DEBUG reaches the client
        leaking = [line for line in proc.stderr.splitlines() if _found(line)]
        assert leaking and all(" kafka." in line for line in leaking), leaking[:3]
        assert logsafety.UNSAFE_ENV in proc.stderr  # the opt-out announces itself
        return
    assert " INFO kafka." in proc.stderr  # the client's INFO lines are kept
    assert " DEBUG kafka" not in proc.stderr
    assert _found(proc.stdout + proc.stderr) == [], [ln[:300] for ln in proc.stderr.splitlines() if _found(ln)][:5]
    models, ledger, letters = _outputs(kafka_bootstrap, cfg)
    assert CANARY_TEXT.encode() in letters and models and ledger
    assert _found(models) == [] and _found(ledger) == []


def test_filter_redacts_bytes_and_protocol_objects_at_every_level():
    """The client's one INFO+ line with raw bytes (an undecodable response) is redacted, not dropped."""
    from kafka.protocol.consumer import FetchResponse

    f = logsafety.ClientPayloadFilter()
    rec = logging.LogRecord("kafka.protocol.parser", logging.ERROR, __file__, 1,
                            "Unable to decode %d-byte buffer: %r", (12, CANARY_TEXT.encode()), None)
    assert f.filter(rec) and _found(rec.getMessage()) == [] and "bytes redacted" in rec.getMessage()
    resp = FetchResponse.__new__(FetchResponse)
    rec = logging.LogRecord("kafka.net.connection", logging.WARNING, __file__, 1, "%s", (resp,), None)
    assert f.filter(rec) and rec.getMessage() == "<FetchResponse redacted>"
    headers = [("detail", CANARY_TEXT.encode())]
    rec = logging.LogRecord("kafka.producer.kafka", logging.WARNING, __file__, 1, "headers=%r", (headers,), None)
    assert f.filter(rec) and _found(rec.getMessage()) == [] and "detail" in rec.getMessage()
    rec = logging.LogRecord("kafka.net.connection", logging.DEBUG, __file__, 1, "x", None, None)
    assert not f.filter(rec)


def test_a_child_logger_set_to_debug_stays_closed(debug_logging, monkeypatch):
    """A later setLevel(DEBUG) on one client logger does not reopen it (the filter drops below INFO)."""
    monkeypatch.delenv(logsafety.UNSAFE_ENV, raising=False)
    assert logsafety.guard_client_logging() is True
    assert logging.getLogger("kafka").level == logging.INFO
    parser = logging.getLogger("kafka.protocol.parser")
    parser.setLevel(logging.DEBUG)
    parser.debug("Recv: %r", CANARY_TEXT.encode())
    parser.error("Unable to decode %d-byte buffer: %r", 20, CANARY_TEXT.encode())
    lines = [line for name, line in debug_logging.lines if name == "kafka.protocol.parser"]
    assert len(lines) == 1 and _found(lines[0]) == [] and "bytes redacted" in lines[0]


@pytest.fixture
def client_loggers(monkeypatch) -> Iterator[None]:
    """Put the client loggers' levels and filters, the guard's bookkeeping and the root level back
    after a test."""
    monkeypatch.setattr(logsafety, "_previous_levels", dict(logsafety._previous_levels))
    root = logging.getLogger()
    saved_root = root.level
    saved = {n: (lg.level, list(lg.filters)) for n, lg in logging.root.manager.loggerDict.items()
             if isinstance(lg, logging.Logger) and (n == "kafka" or n.startswith("kafka."))}
    try:
        yield
    finally:
        root.setLevel(saved_root)
        for name, (level, filters) in saved.items():
            logging.getLogger(name).setLevel(level)
            logging.getLogger(name).filters[:] = filters


@pytest.mark.parametrize("root_level, floor", [(logging.DEBUG, logging.INFO), (logging.INFO, logging.WARNING),
                                               (logging.WARNING, logging.WARNING)])
def test_the_client_floor_follows_the_run_level(root_level, floor, client_loggers, monkeypatch):
    """The client's INFO lines are connection chatter: off unless the run logs at DEBUG."""
    monkeypatch.delenv(logsafety.UNSAFE_ENV, raising=False)
    logging.getLogger().setLevel(logging.WARNING)
    assert logsafety.guard_client_logging() is True  # as at import, before the CLI configures logging
    assert logging.getLogger("kafka").level == logging.WARNING
    logging.getLogger().setLevel(root_level)
    assert logsafety.guard_client_logging() is True  # as the CLI, after configuring logging
    assert logging.getLogger("kafka").level == floor
    conn = logging.getLogger("kafka.net.connection")
    assert conn.isEnabledFor(logging.INFO) is (floor == logging.INFO)
    assert not conn.isEnabledFor(logging.DEBUG)


def test_the_guard_keeps_a_higher_level_set_by_the_user(client_loggers, monkeypatch):
    monkeypatch.delenv(logsafety.UNSAFE_ENV, raising=False)
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    logsafety.guard_client_logging()
    assert logging.getLogger("kafka").level == logging.ERROR


def _admin_config_record(password: str) -> logging.LogRecord:
    """The line kafka-python's admin client logs at DEBUG when it starts: its whole configuration."""
    config = {"bootstrap_servers": ["b:9092"], "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
              "sasl_plain_username": "u", "sasl_plain_password": password, "ssl_password": password}
    return logging.LogRecord("kafka.admin.client", logging.DEBUG, __file__, 1,
                             "Starting KafkaAdminClient with configuration: %s", (config,), None)


def test_secrets_are_redacted_by_key_and_by_value():
    f = logsafety.ClientSecretFilter()
    canary = f"pw-{uuid.uuid4().hex}"
    rec = _admin_config_record(canary)
    assert f.filter(rec)
    text = rec.getMessage()
    assert canary not in text and "'sasl_plain_password': '<redacted>'" in text and "'sasl_plain_username': 'u'" in text
    # a registered secret is redacted wherever it shows, here inside an object's repr
    logsafety.register_secret(canary)

    class Conf:
        def __repr__(self) -> str:
            return f"Conf(jaas='username=u password={canary}')"

    rec = logging.LogRecord("kafka.x", logging.WARNING, __file__, 1, "using %r", (Conf(),), None)
    assert f.filter(rec) and canary not in rec.getMessage() and "password=<redacted>" in rec.getMessage()


def test_the_unsafe_switch_keeps_secrets_redacted(debug_logging, monkeypatch):
    """The opt-out lifts the floor and the payload filter, not the secret filter: the admin client's
    configuration line gets through at DEBUG (so the control could see a leak) without its password."""
    monkeypatch.setenv(logsafety.UNSAFE_ENV, "1")
    assert logsafety.guard_client_logging() is False
    canary = f"pw-{uuid.uuid4().hex}"
    admin_log = logging.getLogger("kafka.admin.client")
    rec = _admin_config_record(canary)
    admin_log.handle(rec)
    lines = [line for name, line in debug_logging.lines if name == "kafka.admin.client"]
    assert lines and "Starting KafkaAdminClient" in lines[-1]
    assert canary not in "\n".join(lines) and "<redacted>" in lines[-1]
