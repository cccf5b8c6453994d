"""`stream-vips demo`: runs with nothing but the package, halts on its budget, writes schema-valid
messages consistent with its ledger, and a JSON summary with the documented keys; for every model
family (linreg, logistic, lda, sbn, sep_bnn), with the synthetic sources they stream."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit

from connectors import connector_class
from connectors.memory import MemoryDeadLetterSink, MemorySink
from connectors.synthetic import SyntheticLdaSource, SyntheticLogisticSource
from stream_vips import messages
from stream_vips.cli import main
from stream_vips.cli.demo import demo_of, demo_source
from stream_vips.config import ConfigError
from stream_vips.models import MODEL_FAMILIES, model_class
from stream_vips.models.lda import MALFORMED_DOCUMENTS, topic_recovery
from stream_vips.models.synthetic import MALFORMED_KINDS, fill
from stream_vips.privacy.accountants import PldAccountant
from stream_vips.privacy.ledger import FileLedger
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict


def test_demo_end_to_end(tmp_path, capsys):
    out, summary_file = tmp_path / "demo", tmp_path / "summary.json"
    code = main(["demo", "--records", "32000", "--out", str(out), "--json-summary", str(summary_file)])
    assert code == 0
    captured = capsys.readouterr()
    assert "records consumed" in captured.out and "non-private" in captured.out
    assert "records" in captured.err and "HALTED" in captured.err  # the progress bar

    s = json.loads(summary_file.read_text())
    for key in ("records", "updates", "epsilon_spent", "epsilon_budget", "halted", "messages_file"):
        assert key in s
    assert s["halted"] is True and s["updates"] == 20  # calibrated for 20 planned steps
    assert s["epsilon_spent"] <= s["epsilon_budget"] == 1.0
    assert s["records_rejected"] > 0 and s["metrics_port"] > 0

    with FileLedger(out / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == s["updates"]
    assert s["epsilon_spent"] == pytest.approx(PldAccountant().epsilon(events, 1e-5), rel=1e-9)
    msgs = [messages.loads(line) for line in (out / "models.jsonl").read_text().splitlines()]  # validates
    assert [m["version"] for m in msgs] == list(range(20)) + [19]
    assert msgs[-1]["privacy"]["halted"] and msgs[-1]["privacy"]["seeded"]
    # The non-private run on the same records is the floor the private model approaches.
    assert s["non_private_model_error"] < s["model_error"] < 10 * s["non_private_model_error"] + 0.2

    # Spent budget is never reset: the same output directory is refused.
    with pytest.raises(SystemExit, match="never reset"):
        main(["demo", "--records", "32000", "--out", str(out), "--no-progress"])


def test_demo_runs_the_families_that_describe_one_and_refuses_the_others(capsys):
    """--family lists the registry; a family whose module describes no demo is refused before
    anything runs, naming the families that have one."""
    with_demo = [f for f in MODEL_FAMILIES if model_class(f).demo is not None]
    assert with_demo == ["linreg", "logistic", "lda", "sbn", "sep_bnn"]
    assert all(model_class(f).demo.about.strip() for f in with_demo)
    assert main(["demo", "--family", "ops", "--no-progress"]) == 2
    assert ("the ops family has no demo (the families with one: linreg, logistic, lda, sbn, sep_bnn)"
            in capsys.readouterr().err)


def test_demo_rejects_too_few_records(capsys):
    assert main(["demo", "--records", "100", "--no-progress"]) == 2
    assert "--records must be at least" in capsys.readouterr().err


def _run_family_demo(tmp_path, family: str) -> tuple[dict, list[dict]]:
    """Run ``stream-vips demo --family`` with its defaults; check what every family shares."""
    out, summary_file = tmp_path / family, tmp_path / f"{family}.json"
    assert main(["demo", "--family", family, "--out", str(out), "--json-summary", str(summary_file),
                 "--no-progress"]) == 0
    s = json.loads(summary_file.read_text())
    for key in ("records", "updates", "epsilon_spent", "epsilon_budget", "halted", "messages_file"):
        assert key in s
    assert s["family"] == family and s["halted"] is True and s["updates"] == 20
    assert s["records_rejected"] > 0 and s["non_private_updates"] >= s["updates"]
    with FileLedger(out / "ledger.jsonl") as ledger:
        events = ledger.events()
    assert len(events) == 20
    assert s["epsilon_spent"] == pytest.approx(PldAccountant().epsilon(events, 1e-5), rel=1e-9)
    assert s["epsilon_spent"] <= s["epsilon_budget"] == 1.0
    msgs = [messages.validate_message(json.loads(line)) for line in (out / "models.jsonl").read_text().splitlines()]
    assert msgs and all(m["family"] == family for m in msgs)
    assert msgs[-1]["privacy"]["halted"] and msgs[-1]["privacy"]["epsilon_spent"] == s["epsilon_spent"]
    return s, msgs


def test_demo_logistic_auc_between_chance_and_non_private(tmp_path):
    s, _ = _run_family_demo(tmp_path, "logistic")
    # The true weights rank by the true P(y = 1 | x), which maximises the population AUC; the
    # non-private model (10^4 records, d = 5) gets within 0.01 of them on the 20000 held-out rows.
    assert s["true_weights_auc"] - 0.01 < s["non_private_auc"] < s["true_weights_auc"] + 0.005
    # The private model can beat the non-private one only by chance: by at most the gap to the
    # true weights plus the paired sampling noise of two near-identical scorers on the same
    # 20000 held-out rows (far below 0.005).
    assert s["auc"] <= s["non_private_auc"] + 0.005
    # Chance is 0.5 with sd sqrt((n1 + n2 + 1) / (12 n1 n2)) < 0.005 at n = 20000: 0.6 is > 20 sd.
    assert s["auc"] > 0.6


def test_demo_lda_perplexity_and_topic_recovery_between_uniform_and_non_private(tmp_path):
    s, msgs = _run_family_demo(tmp_path, "lda")
    assert msgs[-1]["hyperparameters"]["n_topics"] == 4
    # Uniform word probabilities have perplexity exactly V; any fit must do better.
    assert s["perplexity"] < s["vocabulary_size"] == 60
    # Noise only moves the private topics away from the non-private ones. The held-out bound is
    # an average over 500 documents x 40 words; its paired (same documents) sampling noise is
    # well under 1% of the perplexity, so 2% covers a lucky private run.
    assert s["perplexity"] >= 0.98 * s["non_private_perplexity"]
    assert s["topic_recovery"] >= s["non_private_topic_recovery"] - 0.02
    # Trivial baseline: uniform topics (what the Hungarian matching gives for no information).
    true_topics = demo_source("lda", 0, 0).topics
    uniform = np.full_like(true_topics, 1.0 / true_topics.shape[1])
    assert s["topic_recovery"] < topic_recovery(true_topics, uniform)


def test_demo_sbn_reconstructs_near_the_true_network(tmp_path):
    s, msgs = _run_family_demo(tmp_path, "sbn")
    assert msgs[-1]["hyperparameters"]["n_latent"] == 3
    # The baseline without a model: each pixel's majority value over the held-out images (the
    # true network's pixels are on about half the time, so about 0.5).
    Y = np.asarray(demo_of("sbn").held_out(demo_source("sbn", 0, 0).data), dtype=float)
    majority = float(np.mean(Y == (Y.mean(axis=0) > 0.5)))
    assert majority < 0.6
    # The true network with its own posterior over z is the ceiling (up to the paired sampling
    # noise of two scorers on the same 48,000 pixels, well under 0.01); the fits come close to it.
    assert s["true_network_pixel_accuracy"] > majority + 0.3
    ceiling = s["true_network_pixel_accuracy"] + 0.01
    assert s["true_network_pixel_accuracy"] - 0.02 < s["non_private_pixel_accuracy"] < ceiling
    assert s["non_private_pixel_accuracy"] - 0.02 < s["pixel_accuracy"] < ceiling


def test_demo_sep_bnn_rmse_between_the_noise_and_the_mean_predictor(tmp_path):
    s, msgs = _run_family_demo(tmp_path, "sep_bnn")
    assert msgs[-1]["hyperparameters"]["hidden"] == 50
    # No model beats the generator's noise std; predicting the mean scores the spread of y; the
    # private network lies between, above its non-private twin on the same records.
    assert s["noise_std"] < s["non_private_rmse"] < s["rmse"] < 0.8 * s["target_std"]


def _dead_letters(source, family: str, params: dict) -> list:
    """Stream ``source`` through a non-private pipeline; return its dead letters."""
    cfg = config_from_dict({
        "model": {"family": family, "params": params},
        "privacy": {"mode": "non_private", "seed": 0, "ledger": {"type": "memory"}},
        "sampling": {"reservoir": 100, "batch_size": 50},
        "schedule": {"every_records": 10_000},
        "sink": {"type": "memory"}, "dead_letter": {"type": "memory"}, "metrics": {"enabled": False},
    }, env={})
    dead = MemoryDeadLetterSink()
    Application.from_config(cfg, source=source, sink=MemorySink(), dead_letter=dead).run()
    return dead.letters


@pytest.mark.parametrize("cls, family, malformed, reasons", [
    (SyntheticLogisticSource, "logistic", MALFORMED_KINDS,
     {"invalid_json", "non_finite", "wrong_shape", "wrong_type", "not_object"}),
    (SyntheticLdaSource, "lda", MALFORMED_DOCUMENTS,
     {"invalid_json", "empty_document", "wrong_type", "missing_field", "out_of_range", "not_object"}),
])
def test_new_synthetic_sources_are_seeded_and_dead_letter_their_malformed_fraction(cls, family, malformed, reasons):
    n, f = 3000, 0.1
    lines = lambda seed: [r.value for r in cls(count=n, seed=seed, malformed_fraction=f).poll(n, 0)]  # noqa: E731
    assert lines(4) == lines(4) and lines(4) != lines(5)
    assert connector_class("source", f"synthetic_{family}") is cls
    source = cls(count=n, seed=4, malformed_fraction=f)
    params = {"dim": source.dimension} if family == "logistic" else {
        "vocabulary": source.vocabulary, "n_topics": source.n_topics, "doc_length": source.doc_length}
    letters = _dead_letters(source, family, params)
    # Binomial(3000, 0.1): mean 300, sd ~16.4; every malformed kind appears and nothing else fails.
    assert abs(len(letters) - n * f) < 5 * np.sqrt(n * f * (1 - f))
    assert {letter.reason for letter in letters} == reasons
    assert {letter.record.value.decode() for letter in letters} <= {fill(t, 5) for t in malformed.values()}


def test_synthetic_logistic_records_follow_the_model():
    w = np.array([3.0, -2.0, 1.0, 0.0, -1.0])
    X, y = SyntheticLogisticSource(dimension=5, weights=w, bias=0.5, seed=2).sample(50_000)
    assert np.all(np.linalg.norm(X, axis=1) <= 1.0) and np.all(X[:, -1] == 0.5)
    p = expit(X @ w)
    # Labels are Bernoulli(sigmoid(w.x)): in each probability decile the label mean matches the
    # mean probability to within 5 binomial standard errors.
    for idx in np.array_split(np.argsort(p), 10):
        se = np.sqrt(p[idx].mean() * (1 - p[idx].mean()) / idx.size)
        assert abs(y[idx].mean() - p[idx].mean()) < 5 * se
    for bad in ({"dimension": 1}, {"bias": 1.0}, {"weights": [1.0]}, {"malformed_fraction": -0.1}):
        with pytest.raises(ValueError):
            SyntheticLogisticSource(**bad)


def test_synthetic_lda_documents_follow_the_generative_process():
    src = SyntheticLdaSource(n_topics=3, vocabulary_size=20, doc_length=30, alpha=0.5, seed=1)
    assert src.topics.shape == (3, 20) and np.allclose(src.topics.sum(axis=1), 1.0)
    docs = src.documents(4000)
    lengths = np.array([len(d) for d in docs])
    assert lengths.min() >= 1 and abs(lengths.mean() - 30) < 5 * np.sqrt(29 / 4000)  # 1 + Poisson(29)
    counts = np.bincount([int(w[1:]) for d in docs for w in d], minlength=20)
    # Symmetric alpha: E[theta] = 1/K, so word frequencies average the topics. The sd of a
    # frequency is dominated by the per-document theta draws; 0.01 is > 5 of them here.
    assert np.abs(counts / counts.sum() - src.topics.mean(axis=0)).max() < 0.01
    # Its configuration keys are checked like every connector's, naming the bad key.
    with pytest.raises(ConfigError, match="source.n_topic"):
        config_from_dict({"source": {"type": "synthetic_lda", "n_topic": 3}}, env={})


def test_serve_s_keeps_the_runs_metrics_up_after_the_summary(tmp_path):
    """The demo's metrics can be scraped after the run (the same port, the final counters)."""
    import os
    import subprocess
    import sys
    import time
    import urllib.request
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.Popen([sys.executable, "-m", "stream_vips.cli", "demo", "--no-progress", "--serve-s", "20",
                             "--out", str(tmp_path / "out"), "--json-summary", str(tmp_path / "s.json")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "s.json").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        port = json.loads((tmp_path / "s.json").read_text())["metrics_port"]
        body = ""
        while time.monotonic() < deadline and "stream_vips_updates_total" not in body:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
        assert "stream_vips_updates_total" in body and "stream_vips_halted 1.0" in body
    finally:
        proc.terminate()
        proc.wait(30)
