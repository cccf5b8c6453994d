"""A real scrape: Debian's Prometheus scrapes ``stream-vips run`` until the budget halts it.

The pipeline runs as the container does (the Dockerfile's ENTRYPOINT, with the config path
pointing at a temporary file): a synthetic source, a small budget, a file ledger and
``runtime.on_halt: stay`` as in k8s/base/app/config.yaml. Prometheus, on loopback with a 1 s
scrape interval, loads the PrometheusRule's groups rendered from k8s/base. The test reads back
through Prometheus' HTTP API that

- the scraped ``stream_vips_epsilon_spent`` equals the epsilon the accountant computes from the
  ledger file, and ``stream_vips_halted`` is 1;
- the model version, update count and rejected counts agree with the ledger and the dead letters;
- the budget-exhausted alert fires from the real series;
- every dashboard query evaluates without error.

Every wait is bounded; both processes are stopped at the end.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from test_k8s import dashboard, dashboard_exprs, dockerfile_instruction, render, require, require_script, rule_groups

pytestmark = pytest.mark.prometheus

EPSILON_BUDGET = 1.0
DELTA = 1e-5
WAIT_S = 90.0  # upper bound on any wait; the whole test normally takes a few seconds


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen | None = None, timeout: float = WAIT_S) -> Any:
    """Poll ``check`` until it returns a truthy value; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"process exited with {proc.returncode} while waiting for {what}")
        try:
            value = check()
        except (OSError, urllib.error.URLError, ValueError, KeyError):
            value = None
        if value:
            return value
        time.sleep(0.25)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read()


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


class PromAPI:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.base}{path}?{urllib.parse.urlencode(params)}" if params else f"{self.base}{path}"
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as exc:  # a refused query fails at once instead of being retried
            raise AssertionError(f"{url}: {exc.code} {exc.read().decode(errors='replace')}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self.get("/api/v1/query", query=expr)["result"]

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if len(result) == 1 else None


def pipeline_config(tmp: Path, metrics_port: int) -> dict[str, Any]:
    """The deployment's config with the Kafka connectors swapped for local ones."""
    deployed = yaml.safe_load((Path(__file__).resolve().parents[1] / "k8s/base/app/config.yaml").read_text())
    cfg = dict(deployed)
    cfg["model"] = {"family": "linreg", "id": "scrape-test", "params": {"dim": 5}}
    cfg["privacy"] = {
        **deployed["privacy"],
        "epsilon": EPSILON_BUDGET, "delta": DELTA, "noise_multiplier": 5.0, "seed": 7,
        "ledger": {"type": "file", "path": str(tmp / "ledger.jsonl")},
    }
    cfg["sampling"] = {"method": "poisson", "reservoir": 500, "batch_size": 100}
    cfg["schedule"] = {**deployed["schedule"], "every_records": 100, "every_seconds": None}
    cfg["source"] = {"type": "synthetic", "count": None, "dimension": 5, "seed": 3, "malformed_fraction": 0.05}
    cfg["sink"] = {"type": "jsonl", "path": str(tmp / "models.jsonl")}
    cfg["dead_letter"] = {"type": "jsonl", "path": str(tmp / "dead-letters.jsonl")}
    cfg["metrics"] = {**deployed["metrics"], "host": "127.0.0.1", "port": metrics_port}
    # the synthetic source cannot seek, so no reservoir checkpoint
    cfg["runtime"] = {**deployed["runtime"], "poll_max_records": 200, "checkpoint_path": None}
    assert cfg["runtime"]["on_halt"] == "stay"
    return cfg


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[PromAPI, Path, subprocess.Popen]]:
    prometheus = require("prometheus")
    metrics_port, prom_port = free_port(), free_port()

    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(pipeline_config(tmp_path, metrics_port)))
    entrypoint = json.loads(dockerfile_instruction("ENTRYPOINT"))
    assert entrypoint[-2] == "--config"
    # the image's command, on the test's config
    argv = [require_script(entrypoint[0], "pip install -e ."), *entrypoint[1:-1], str(config_path)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env = {k: v for k, v in env.items() if not k.startswith("STREAM_VIPS__")}

    (tmp_path / "stream-vips.rules.yaml").write_text(yaml.safe_dump(rule_groups(render("base")), sort_keys=False))
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": ["stream-vips.rules.yaml"],
        "scrape_configs": [{"job_name": "stream-vips", "static_configs": [{
            "targets": [f"127.0.0.1:{metrics_port}"],
            # the target labels the Prometheus Operator attaches to a ServiceMonitor's targets
            "labels": {"namespace": "stream-vips", "pod": "stream-vips-0"},
        }]}],
    }))
    prom_log = open(tmp_path / "prometheus.log", "wb")
    app_log = open(tmp_path / "stream-vips.log", "wb")
    prom = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}", "--storage.tsdb.retention.time=1h"],
        stdout=prom_log, stderr=subprocess.STDOUT, cwd=tmp_path,
    )
    app = subprocess.Popen(argv, stdout=app_log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
    try:
        wait_for("Prometheus ready", lambda: http_get(f"http://127.0.0.1:{prom_port}/-/ready"), prom)
        yield PromAPI(prom_port), tmp_path, app
    finally:
        stop(app)
        stop(prom)
        prom_log.close()
        app_log.close()
        for name in ("stream-vips.log", "prometheus.log"):
            tail = (tmp_path / name).read_text(errors="replace")[-3000:]
            print(f"--- {name} (tail)\n{tail}")


def ledger_epsilon(path: Path) -> tuple[float, int]:
    """(epsilon, number of events) computed from the ledger file alone."""
    from stream_vips.privacy.accountants import make_accountant
    from stream_vips.privacy.ledger import FileLedger

    ledger = FileLedger(path)
    try:
        events = ledger.events()
    finally:
        ledger.close()
    return make_accountant("auto", "poisson").epsilon(events, DELTA), len(events)


def test_prometheus_scrapes_the_halted_pipeline(stack: tuple[PromAPI, Path, subprocess.Popen]) -> None:
    api, tmp, app = stack
    wait_for("the pipeline's /readyz", lambda: http_get(
        f"http://127.0.0.1:{yaml.safe_load((tmp / 'config.yaml').read_text())['metrics']['port']}/readyz"), app)
    # halted, and at least one scrape after the halt so the final epsilon is in
    wait_for("stream_vips_halted == 1 in Prometheus", lambda: api.scalar("stream_vips_halted") == 1.0, app)
    wait_for("two scrapes after the halt", lambda: api.scalar("sum_over_time(stream_vips_halted[1h])") >= 2, app)
    assert app.poll() is None, "on_halt: stay keeps the process serving"
    assert api.scalar('up{job="stream-vips"}') == 1.0

    scraped = {
        name: api.scalar(name)
        for name in ("stream_vips_epsilon_spent", "stream_vips_epsilon_budget", "stream_vips_delta",
                     "stream_vips_model_version", "stream_vips_updates_total", "stream_vips_reservoir_records",
                     "stream_vips_reservoir_capacity")
    }
    rejected = {r["metric"]["reason"]: float(r["value"][1]) for r in api.query("stream_vips_records_rejected_total")}
    build = api.query("stream_vips_build_info")

    # the alert evaluates on the real series
    def firing() -> set[str]:
        return {a["labels"]["alertname"] for a in api.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"}

    alerts_firing = wait_for("StreamVipsBudgetExhausted firing",
                             lambda: "StreamVipsBudgetExhausted" in firing() and firing(), app)
    assert "StreamVipsBudget80PercentSpent" not in alerts_firing  # superseded once halted
    assert "StreamVipsDown" not in alerts_firing

    # every dashboard query is valid PromQL on this Prometheus, and the core panels have data
    empty = []
    for title, expr in dashboard_exprs(dashboard(render("base"))):
        if not api.query(expr):
            empty.append(title)
    assert not {"Privacy budget used", "Epsilon spent against budget", "Model version", "Updates"} & set(empty), empty

    assert stop(app) == 0
    epsilon, steps = ledger_epsilon(tmp / "ledger.jsonl")
    assert steps >= 1
    assert 0 < epsilon <= EPSILON_BUDGET
    assert math.isclose(scraped["stream_vips_epsilon_spent"], epsilon, rel_tol=1e-12), (scraped, epsilon)
    assert scraped["stream_vips_epsilon_budget"] == EPSILON_BUDGET and scraped["stream_vips_delta"] == DELTA
    assert scraped["stream_vips_model_version"] == steps - 1  # version = ledger step index
    assert scraped["stream_vips_updates_total"] == steps
    assert scraped["stream_vips_reservoir_records"] == scraped["stream_vips_reservoir_capacity"] == 500
    # one more step would have exceeded the budget, so the run really halted on the budget
    models = [json.loads(line) for line in (tmp / "models.jsonl").read_text().splitlines()]
    assert models[-1]["privacy"]["halted"] is True
    assert math.isclose(models[-1]["privacy"]["epsilon_spent"], epsilon, rel_tol=1e-12)
    dead = (tmp / "dead-letters.jsonl").read_text().splitlines()
    assert dead and sum(rejected.values()) == len(dead)
    assert len(build) == 1 and build[0]["metric"]["family"] == "linreg" and build[0]["metric"]["sampling"] == "poisson"
    assert shutil.which("promtool")  # the same Debian package serves both tools
