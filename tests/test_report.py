"""`stream-vips report`: a PNG and a self-contained HTML page from a real small run (ledger, model
file, dead letters), epsilon recomputed from the ledger and equal to what the messages report,
a bounded number of accountant evaluations for long ledgers, and one clear line without
matplotlib or without a broker."""

from __future__ import annotations

import base64
import json
import re
import socket
import sys
import time
from collections import OrderedDict
from pathlib import Path

import pytest

import stream_vips.cli as cli
from connectors.memory import MemorySource
from connectors.synthetic import SyntheticRegressionSource
from stream_vips.cli import report as sv_report
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import FileLedger
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

DIM = 3
Z = {"poisson": 2.0, "fixed": 5.0}  # autodp's bound is looser: more noise for several steps


def run_pipeline(tmp_path: Path, method: str) -> dict[str, Path]:
    """A real run to the budget: file ledger, JSONL models and dead letters (2% malformed records)."""
    paths = {"ledger": tmp_path / "ledger.jsonl", "models": tmp_path / "models.jsonl", "dead": tmp_path / "dead.jsonl"}
    cfg = config_from_dict({
        "model": {"family": "linreg", "id": "rep", "params": {"dim": DIM, "y_bound": 2.0}},
        "privacy": {"epsilon": 1.5, "delta": 1e-5, "noise_multiplier": Z[method], "seed": 5,
                    "ledger": {"type": "file", "path": str(paths["ledger"])}},
        "sampling": {"method": method, "reservoir": 200, "batch_size": 20},
        "schedule": {"every_records": 40, "tau0": 5.0},
        "sink": {"type": "jsonl", "path": str(paths["models"])},
        "dead_letter": {"type": "jsonl", "path": str(paths["dead"])},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 200, "poll_timeout_s": 0.01, "publish_interval_s": 0.0},
    }, env={})
    lines = SyntheticRegressionSource(count=20_000, dimension=DIM, seed=2, malformed_fraction=0.02).generate(20_000)
    stats = Application.from_config(cfg, source=MemorySource(lines)).run()
    assert stats.halted and stats.updates >= 5
    return paths


@pytest.fixture(scope="module", params=["poisson", "fixed"])
def finished_run(request, tmp_path_factory):
    return run_pipeline(tmp_path_factory.mktemp(f"run-{request.param}"), request.param)


def messages_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_report_of_a_real_run_writes_a_png_and_a_self_contained_page(finished_run, tmp_path, capsys):
    out = tmp_path / "out"
    code = cli.main(["report", "--ledger", str(finished_run["ledger"]), "--models", str(finished_run["models"]),
                     "--dead-letters", str(finished_run["dead"]), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    png, page = (out / "report.png").read_bytes(), (out / "report.html").read_text()

    from matplotlib.image import imread

    pixels = imread(out / "report.png", format="png")  # decodes
    assert pixels.ndim == 3 and pixels.shape[0] > 500 and pixels.shape[1] > 800
    assert pixels[..., :3].std() > 0.05  # not a blank canvas

    with FileLedger(finished_run["ledger"]) as ledger:
        ledger_id, events = ledger.ledger_id, ledger.events()
    last = messages_of(finished_run["models"])[-1]
    assert last["privacy"]["ledger_id"] == ledger_id
    assert ledger_id in page and re.search(rf'id="ledger-id">{ledger_id}<', page)
    shown = float(re.search(r'id="epsilon-spent" data-value="([^"]+)"', page).group(1))
    assert shown == pytest.approx(last["privacy"]["epsilon_spent"], rel=1e-6)
    assert f"{shown:.6g}" in page
    assert shown <= 1.5 and len(events) == last["privacy"]["steps"]

    # self-contained: the PNG itself is inline, nothing is fetched
    inline = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page).group(1)
    assert base64.b64decode(inline) == png
    assert not re.search(r'(src|href)="(?!data:)', page)
    # what the guarantee covers, and the run's facts
    for words in ("Record-level (epsilon, delta)-differential privacy", "replace-one", "Seeded noise",
                  "halted", "posterior mean", "w[2]", "invalid_json"):
        assert words in page, words
    dead_reasons = {json.loads(x)["reason"] for x in finished_run["dead"].read_text().splitlines()}
    assert dead_reasons and all(reason in page for reason in dead_reasons)
    assert "wrote" in capsys.readouterr().err


def test_the_epsilon_curve_is_the_accountants_epsilon_of_each_ledger_prefix(finished_run):
    """Every evaluated count equals what the published message after that step reports."""
    ledger = sv_report.read_ledger(finished_run["ledger"])
    msgs = messages_of(finished_run["models"])
    report = sv_report.build_report(ledger, sv_report.models_from_file(finished_run["models"], None), None)
    assert report.warnings == []
    by_steps = {m["privacy"]["steps"]: m["privacy"]["epsilon_spent"] for m in msgs}
    assert [k for k, _ in report.curve] == list(range(1, len(ledger.events) + 1))  # short ledger: every step
    for k, eps in report.curve:
        assert eps == pytest.approx(by_steps[k], rel=1e-9), k
    fresh = make_accountant("auto", msgs[-1]["privacy"]["sampling"])
    assert report.final_epsilon == pytest.approx(fresh.epsilon(ledger.events, 1e-5), rel=1e-9)
    assert report.runs == [(1, len(ledger.events), Z[msgs[-1]["privacy"]["sampling"]], 0.1)]


def test_reading_the_ledger_neither_locks_nor_changes_it(finished_run):
    before = finished_run["ledger"].read_bytes()
    with FileLedger(finished_run["ledger"]):  # a running pipeline holds the lock
        view = sv_report.read_ledger(finished_run["ledger"])
    assert finished_run["ledger"].read_bytes() == before and len(view.events) >= 5


class CountingAccountant:
    """Counts evaluations; epsilon = total count (monotone, cheap)."""

    def __init__(self) -> None:
        self.calls = 0

    def check(self, event: object) -> None:
        pass

    def epsilon_of_counts(self, counts: OrderedDict, delta: float) -> float:
        self.calls += 1
        return float(sum(counts.values()))


def test_a_million_steps_cost_a_bounded_number_of_evaluations():
    event = SubsampledGaussianEvent(1.0, 0.01, "poisson")
    events = [event] * 1_000_000
    acct = CountingAccountant()
    started = time.monotonic()
    curve = sv_report.epsilon_curve(events, 1e-5, acct, points=200)
    assert acct.calls == len(curve) <= 201
    assert curve[0] == (1, 1.0) and curve[-1] == (1_000_000, 1_000_000.0)
    ks = [k for k, _ in curve]
    assert ks == sorted(set(ks)) and all(eps == k for k, eps in curve)
    assert time.monotonic() - started < 30
    assert sv_report.step_counts(50, 200) == list(range(1, 51))


def test_mechanism_runs_follow_changes_of_the_noise_multiplier():
    a, b = SubsampledGaussianEvent(1.0, 0.1, "poisson"), SubsampledGaussianEvent(2.0, 0.1, "poisson")
    assert sv_report.mechanism_runs([a, a, b, b, b, a]) == [(1, 2, 1.0, 0.1), (3, 5, 2.0, 0.1), (6, 6, 1.0, 0.1)]


def test_without_matplotlib_one_line_names_the_extra(finished_run, tmp_path, monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code = cli.main(["report", "--ledger", str(finished_run["ledger"]), "--models", str(finished_run["models"]),
                     "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "pip install 'stream_vips[report]'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_bad_inputs_are_one_line_with_their_exit_code(finished_run, tmp_path, capsys):
    args = ["report", "--ledger", str(finished_run["ledger"]), "--out", str(tmp_path / "o")]
    assert cli.main([*args[:2], str(tmp_path / "none.jsonl"), *args[3:], "--models", str(finished_run["models"])]) == 2
    assert "cannot read the ledger" in capsys.readouterr().err
    assert cli.main([*args, "--models", str(finished_run["models"]), "--model-id", "absent"]) == 1
    assert "no model 'absent'" in capsys.readouterr().err
    two = tmp_path / "two.jsonl"
    first = messages_of(finished_run["models"])[0]
    two.write_text(finished_run["models"].read_text() + json.dumps({**first, "model_id": "other"}) + "\n")
    assert cli.main([*args, "--models", str(two)]) == 2
    assert "--model-id" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(finished_run["ledger"].read_bytes().replace(b'"step":1', b'"step":7', 1))
    assert cli.main(["report", "--ledger", str(corrupt), "--models", str(finished_run["models"]),
                     "--out", str(tmp_path / "o")]) == 2
    assert "corrupt" in capsys.readouterr().err


def test_a_model_paid_for_by_another_ledger_is_flagged(finished_run, tmp_path):
    other = tmp_path / "other-ledger.jsonl"
    with FileLedger(other) as ledger:
        for event in sv_report.read_ledger(finished_run["ledger"]).events:
            ledger.append(event)
    report = sv_report.build_report(sv_report.read_ledger(other),
                                    sv_report.models_from_file(finished_run["models"], None), None)
    assert any("did not pay for it" in w for w in report.warnings)
    sv_report.write_report(report, tmp_path / "out")
    assert "did not pay for it" in (tmp_path / "out" / "report.html").read_text()


def test_an_unreachable_broker_fails_within_the_deadline(finished_run, tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    started = time.monotonic()
    code = cli.main(["report", "--ledger", str(finished_run["ledger"]), "--bootstrap", f"127.0.0.1:{port}",
                     "--topic", "t", "--out", str(tmp_path / "o"), "--timeout-s", "1.5"])
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 5 and elapsed < 1.5 * 2 + 3, elapsed
    assert err.count("\n") == 1 and "cannot reach the Kafka broker" in err


def test_a_ledger_topic_needs_bootstrap(finished_run, tmp_path, capsys):
    code = cli.main(["report", "--ledger-topic", "t", "--models", str(finished_run["models"]),
                     "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--bootstrap" in err


@pytest.mark.kafka
def test_a_kafka_ledger_is_read_committed_and_its_writer_keeps_appending(kafka_bootstrap, tmp_path, capsys):
    """A run paid by a Kafka ledger: the report reads it without fencing the writer (the writer's
    next append still commits) and recomputes the epsilon its messages report."""
    from connectors.kafka import KafkaLedger
    from kafka_broker import WEAK_LEDGER, unique_topic

    topic, models = unique_topic("report-ledger"), tmp_path / "models.jsonl"
    cfg = config_from_dict({
        "model": {"family": "linreg", "id": "rep", "params": {"dim": DIM, "y_bound": 2.0}},
        "privacy": {"epsilon": 1.5, "delta": 1e-5, "noise_multiplier": Z["poisson"], "seed": 5,
                    "ledger": {"type": "kafka", "options": {"bootstrap_servers": kafka_bootstrap, "topic": topic,
                                                            "name": "run", **WEAK_LEDGER}}},
        "sampling": {"method": "poisson", "reservoir": 200, "batch_size": 20},
        "schedule": {"every_records": 400, "tau0": 5.0},
        "sink": {"type": "jsonl", "path": str(models)}, "dead_letter": {"type": "memory"},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 200, "poll_timeout_s": 0.01, "publish_interval_s": 0.0},
    }, env={})
    lines = SyntheticRegressionSource(count=4_000, dimension=DIM, seed=2).generate(4_000)
    stats = Application.from_config(cfg, source=MemorySource(lines, finite=True)).run()
    assert stats.updates >= 5
    writer = KafkaLedger(kafka_bootstrap, topic, name="run", create_topic=False, **WEAK_LEDGER)
    try:
        code = cli.main(["report", "--ledger-topic", topic, "--ledger-name", "run", "--bootstrap", kafka_bootstrap,
                         "--models", str(models), "--out", str(tmp_path / "out"), "--timeout-s", "20"])
        err = capsys.readouterr().err
        assert code == 0, err
        assert "warning" not in err and f"after {stats.updates} steps (ledger {writer.ledger_id})" in err
        last = messages_of(models)[-1]
        page = (tmp_path / "out" / "report.html").read_text()
        shown = float(re.search(r'id="epsilon-spent" data-value="([^"]+)"', page).group(1))
        assert shown == pytest.approx(last["privacy"]["epsilon_spent"], rel=1e-6)
        # not fenced
        writer.append(SubsampledGaussianEvent(noise_multiplier=2.0, sampling_rate=0.1, sampling="poisson"))
        assert len(writer.events()) == stats.updates + 1
    finally:
        writer.close()
    assert cli.main(["report", "--ledger-topic", topic, "--ledger-name", "absent", "--bootstrap", kafka_bootstrap,
                     "--models", str(models), "--out", str(tmp_path / "o2")]) == 2
    assert "has no steps" in capsys.readouterr().err


def test_a_fit_published_within_a_second_plots_without_a_warning(tmp_path, capsys):
    """A finite fit publishes every message within a second; the time axis must still get ticks
    (matplotlib's date locator warned on the sub-second range and defaulted its interval)."""
    import warnings

    import numpy as np

    from stream_vips.fitting import fit

    rng = np.random.default_rng(0)
    X = rng.uniform(-0.5, 0.5, (300, 2))
    res = fit((X, X @ np.array([1.0, -1.0])), "linreg", epsilon=1.0, delta=1e-5, ledger_path=str(tmp_path / "l.jsonl"))
    (tmp_path / "m.jsonl").write_text(json.dumps(res.message) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        code = cli.main(["report", "--ledger", str(tmp_path / "l.jsonl"), "--models", str(tmp_path / "m.jsonl"),
                         "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "report.png").stat().st_size > 10_000
