"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

# --- Kafka: one real Apache Kafka broker (KRaft, loopback) per test session -------------------------

@pytest.fixture(scope="session")
def kafka_broker():
    """A running single-node broker; skipped with a reason locally, a failure under CI=true."""
    from kafka_broker import BrokerError, KafkaBroker, in_ci

    broker = KafkaBroker()
    try:
        broker.start()
    except BrokerError as exc:
        broker.cleanup()
        if in_ci():
            pytest.fail(f"Kafka broker could not start under CI: {exc}", pytrace=False)
        pytest.skip(f"Kafka broker could not start: {exc}")
    yield broker
    broker.cleanup()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker) -> str:
    return kafka_broker.bootstrap


# --- Nothing written into the working directory ---------------------------------------------------

#: Entries a test session may create in the working directory (caches).
_CACHES = {"__pycache__", ".pytest_cache", ".hypothesis"}


def pytest_sessionstart(session: pytest.Session) -> None:
    import os

    session.config._cwd_before = set(os.listdir("."))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test that runs the pipeline with a default path (ledger.jsonl, dead-letters.jsonl, ...)
    writes into the directory the suite runs from: fail the session naming what appeared."""
    import os

    before = getattr(session.config, "_cwd_before", None)
    if before is None:
        return
    new = sorted(set(os.listdir(".")) - before - _CACHES)
    if new:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        line = f"FAILED: the tests wrote into the working directory {os.getcwd()}: {new}"
        if reporter is not None:
            reporter.write_line(line, red=True)
        else:
            print(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
