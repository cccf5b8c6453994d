"""The model topic read without our Python client: kcat + jq (docs/model-topic.md's one-liner) and
the Go consumer of examples/go-consumer, on the real broker after Python fits have published.

Published: logistic, linreg (known and Gamma noise) and sep_mixture fits of small synthetic sets,
and an LDA over a 40,000-word vocabulary whose message (about 2 MB) the sink splits into chunks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import pytest

from connectors.kafka import KafkaModelSink
from kafka_broker import unique_topic
from stream_vips import messages
from stream_vips.client import ModelReader
from stream_vips.fitting.api import fit
from stream_vips.models import model_class

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "model-topic.md"
#: Vocabulary of the chunked LDA: K x V float64 lambda, base64, is about 1.7 MB, over the 1 MB limit.
BIG_VOCABULARY = 40_000


def _records(family: str, n: int, seed: int) -> tuple[list[dict], int]:
    data = model_class(family).synthetic(np.random.default_rng(seed))
    return [json.loads(line) for line in data.records(n)], int(data.model_params["dim"])


def _fits() -> tuple[dict[str, dict], dict]:
    """model id -> the message of a seeded fit (what a Python run publishes), and an earlier
    logistic version (one step) to be superseded."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recs, d = _records("logistic", 3000, 1)
        early = fit(recs, "logistic", 0.5, seed=1, dim=d, steps=1, model_id="logistic").message
        out["logistic"] = fit(recs, "logistic", 1.0, seed=1, dim=d, model_id="logistic").message
        recs, d = _records("linreg", 2000, 2)
        out["linreg"] = fit(recs, "linreg", 1.0, seed=2, dim=d, model_id="linreg").message
        out["linreg-gamma"] = fit(recs, "linreg", 1.0, seed=3, dim=d, model_id="linreg-gamma",
                                  noise="gamma").message
        recs, d = _records("sep_mixture", 2000, 4)
        out["sep_mixture"] = fit(recs, "sep_mixture", 1.0, seed=4, dim=d, model_id="sep_mixture").message
        vocab = [f"w{i}" for i in range(BIG_VOCABULARY)]
        rng = np.random.default_rng(5)
        docs = [{"tokens": [f"w{int(w)}" for w in rng.integers(0, 200, size=30)]} for _ in range(300)]
        out["lda"] = fit(docs, "lda", 1.0, seed=5, steps=2, model_id="lda", vocabulary=vocab, n_topics=4,
                         doc_length=30).message
    return out, early


@pytest.fixture(scope="module")
def published(kafka_bootstrap):
    """The fits' messages published by the Kafka model sink, after an earlier logistic version."""
    topic = unique_topic("models")
    fits, early = _fits()
    assert early["version"] < fits["logistic"]["version"]
    sink = KafkaModelSink(kafka_bootstrap, topic)
    try:
        sink.publish("logistic", early)
        for model_id, msg in fits.items():
            sink.publish(model_id, msg)
        sink.flush()
        chunked = sink.chunked_messages
    finally:
        sink.close()
    return {"topic": topic, "bootstrap": kafka_bootstrap, "fits": fits, "chunked": chunked}


def test_the_lda_message_is_chunked_and_the_python_reader_reassembles_it(published):
    assert published["chunked"] == 1  # the LDA alone
    with ModelReader(published["bootstrap"], published["topic"]) as reader:
        reader.poll(timeout_s=30)
        latest = reader.latest()
    assert set(latest) == set(published["fits"]) and not reader.invalid
    assert latest["lda"] == published["fits"]["lda"]


def _one_liner() -> str:
    """The kcat + jq command of docs/model-topic.md (the fenced block after 'latest summary')."""
    text = DOC.read_text()
    found = re.search(r"<!-- one-liner -->\s*```sh\n(.*?)```", text, re.S)
    assert found, "docs/model-topic.md lost its kcat one-liner block"
    return found.group(1)


@pytest.mark.parametrize("model_id", ["logistic", "lda"])
def test_the_documented_kcat_jq_one_liner_prints_the_latest_summary(published, model_id):
    for tool in ("kcat", "jq"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (.ci/run installs it)")
    env = {**os.environ, "BOOTSTRAP": published["bootstrap"], "TOPIC": published["topic"], "MODEL": model_id}
    out = subprocess.run(["bash", "-o", "pipefail", "-c", _one_liner()], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == published["fits"][model_id]["summary"]


# --- the Go consumer ----------------------------------------------------------------------------

GO_CONSUMER = ROOT / "examples" / "go-consumer"
#: Agreement of the Go consumer's predictions with the Python client's.
PREDICTION_ATOL = 1e-9


def _go() -> str:
    """The go command (PATH, else the standard install); a failure under CI, else a skip."""
    from kafka_broker import in_ci

    found = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if Path(p).exists()), None)
    if found is None:
        message = "Go is not installed (.ci/go-setup.sh needs it)"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


@pytest.fixture(scope="module")
def go_output(published, tmp_path_factory):
    """Build examples/go-consumer (modules from the module cache .ci/go-setup.sh fills; go.sum
    pins them) and run it on the published topic."""
    binary = tmp_path_factory.mktemp("go") / "go-consumer"
    env = {**os.environ, "GOFLAGS": "-mod=mod"}
    build = subprocess.run([_go(), "build", "-o", str(binary), "."], cwd=GO_CONSUMER, env=env,
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary), "-brokers", published["bootstrap"], "-topic", published["topic"],
                          "-schema", str(ROOT / "stream_vips" / "schemas" / "model-message.v1.json"), "-bits"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "skipped" not in run.stderr, run.stderr
    return json.loads(run.stdout)["models"]


def test_the_go_consumer_reads_the_latest_version_of_every_model(published, go_output):
    fits = published["fits"]
    assert set(go_output) == set(fits)
    for model_id, msg in fits.items():
        assert go_output[model_id]["version"] == msg["version"], model_id
        assert go_output[model_id]["private"] is messages.is_private(msg)
        assert go_output[model_id]["predictive"] == msg["summary"]["predictive"]
    assert go_output["lda"]["chunked"] == 1 and go_output["logistic"]["chunked"] == 0


def test_the_go_consumer_decodes_every_array_bit_for_bit(published, go_output):
    for model_id, msg in published["fits"].items():
        state = messages.decode_state(msg)
        arrays = go_output[model_id]["arrays"]
        assert set(arrays) == set(state), model_id
        for name, value in state.items():
            got = arrays[name]
            assert got["shape"] == list(value.shape) and got["dtype"] == str(value.dtype)
            bits = [f"{b:016x}" for b in value.astype(np.float64).ravel().view(np.uint64).tolist()]
            assert got["bits"] == bits, f"{model_id}: {name}"


def _python_predictions(family: str, model, X: np.ndarray) -> dict:
    if family == "logistic":
        return {"p": model.predict_proba(X)}
    if family == "linreg":
        mean, var = model.predictive(X)
        return {"mean": mean, "variance": var}
    return {"responsibilities": model.responsibilities(X), "component": model.predict(X)}


@pytest.mark.parametrize("model_id", ["logistic", "linreg", "linreg-gamma", "sep_mixture"])
def test_go_predictions_from_the_summary_and_the_full_parameters_equal_the_python_clients(
        published, go_output, model_id):
    from stream_vips.client import posterior_from_message

    msg, got = published["fits"][model_id], go_output[model_id]
    X = np.asarray(got["inputs"], dtype=float)
    assert X.shape[0] == 5 and np.abs(X).max() > 0.5
    expected = _python_predictions(msg["family"], posterior_from_message(msg).model, X)
    for source in ("from_summary", "from_full_parameters"):
        for key, value in expected.items():
            np.testing.assert_allclose(np.asarray(got[source][key], dtype=float), value, rtol=0,
                                       atol=PREDICTION_ATOL, err_msg=f"{model_id} {source} {key}")
    if msg["family"] == "logistic":  # not a degenerate model: the inputs get different answers
        assert np.ptp(expected["p"]) > 0.05


def test_go_reads_the_chunked_lda_top_words_from_both_sources(published, go_output):
    from stream_vips.client import posterior_from_message

    got = go_output["lda"]
    model = posterior_from_message(published["fits"]["lda"]).model
    assert got["from_summary"]["top_words"] == got["from_full_parameters"]["top_words"] == model.top_words(8)
