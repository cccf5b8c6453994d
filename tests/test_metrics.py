"""Metrics: names per docs/architecture.md on a private registry, an exposition that passes
``promtool check metrics``, and the /metrics /healthz /readyz endpoints."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from stream_vips.service.metrics import TIMING_CAVEAT, Metrics, MetricsServer

NAMES = [
    "stream_vips_records_consumed_total", "stream_vips_records_rejected_total", "stream_vips_reservoir_records",
    "stream_vips_reservoir_capacity", "stream_vips_updates_total", "stream_vips_update_duration_seconds_bucket",
    "stream_vips_epsilon_spent", "stream_vips_epsilon_budget", "stream_vips_delta", "stream_vips_halted",
    "stream_vips_model_version", "stream_vips_last_update_timestamp_seconds", "stream_vips_publish_failures_total",
    "stream_vips_consumer_lag_records", "stream_vips_build_info",
]


def populated() -> Metrics:
    m = Metrics(family="linreg", sampling="poisson", accountant="pld")
    m.records_consumed.inc(10)
    m.records_rejected.labels(reason="non_finite").inc(2)
    m.reservoir_records.set(8)
    m.reservoir_capacity.set(100)
    m.updates.inc()
    m.update_duration.observe(0.003)
    m.epsilon_spent.set(0.25)
    m.epsilon_budget.set(1.0)
    m.delta.set(1e-5)
    m.halted.set(0)
    m.model_version.set(0)
    m.last_update_timestamp.set(time.time())
    m.publish_failures.inc(0)
    m.consumer_lag.labels(topic="records", partition="0").set(5)
    return m


def test_timing_metrics_say_they_are_outside_the_guarantee():
    """Update timing depends on the batch and the E-step's work and is exported unnoised: the HELP
    lines must say it is outside the guarantee; no other metric carries that note."""
    text = populated().exposition().decode()
    helps = {line.split()[2]: line for line in text.splitlines() if line.startswith("# HELP ")}
    timing = {"stream_vips_update_duration_seconds", "stream_vips_last_update_timestamp_seconds"}
    for name in timing:
        assert "Outside the privacy guarantee" in helps[name] and "docs/privacy.md" in helps[name], helps[name]
    assert [n for n, h in helps.items()
            if "Outside the privacy guarantee" in h and n.removesuffix("_created") not in timing] == []
    assert "Outside the privacy guarantee" in TIMING_CAVEAT


def test_every_documented_metric_is_exported():
    text = populated().exposition().decode()
    for name in NAMES:
        assert f"\n{name}" in text or text.startswith(name), name
    assert 'stream_vips_build_info{accountant="pld",family="linreg",sampling="poisson",version=' in text


@pytest.mark.prometheus
def test_exposition_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    result = subprocess.run([promtool, "check", "metrics"], input=populated().exposition(),
                            capture_output=True, timeout=60)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()


def test_process_and_platform_series_are_exported():
    """The private registry carries prometheus_client's process, platform and GC collectors, so
    the usual process_* and python_* series are scraped with the application's own."""
    text = populated().exposition().decode()
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    assert {"process_cpu_seconds_total", "python_info", "python_gc_objects_collected_total"} <= names
    if sys.platform.startswith("linux"):  # ProcessCollector reads /proc
        assert {"process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds"} <= names
    assert Metrics().registry.get_sample_value("process_cpu_seconds_total") > 0  # a second instance has them too


def test_registries_are_private_to_each_instance():
    a, b = Metrics(), Metrics()
    a.updates.inc(3)
    assert a.registry.get_sample_value("stream_vips_updates_total") == 3
    assert b.registry.get_sample_value("stream_vips_updates_total") == 0


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_endpoints_on_a_free_port():
    m = populated()
    m.health_timeout_s = 0.3
    server = MetricsServer(m, "127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert server.port > 0
        status, body = _get(base + "/metrics")
        assert status == 200 and b"stream_vips_records_consumed_total 10.0" in body
        assert _get(base + "/readyz")[0] == 503  # not ready until the run loop says so
        m.set_ready(True)
        assert _get(base + "/readyz")[0] == 200
        m.tick()
        assert _get(base + "/healthz")[0] == 200
        time.sleep(0.4)  # the loop stopped ticking
        assert _get(base + "/healthz")[0] == 503
        m.tick()
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/nope")[0] == 404
    finally:
        server.close()
