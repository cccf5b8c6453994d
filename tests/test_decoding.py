"""Batch decoding in the pipeline's process and in the decode worker: same rows, same rejects."""

from __future__ import annotations

import gc
import json
import os
import signal

import numpy as np
import pytest

from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
from connectors.synthetic import SyntheticLdaSource, SyntheticRegressionSource
from stream_vips.config import ConfigError
from stream_vips.core.data.decoding import DecoderError, InlineDecoder, ProcessDecoder, make_decoder
from stream_vips.models import model_class
from stream_vips.service.app import Application
from stream_vips.service.build import config_from_dict

LINREG = {"dim": 3, "dataset_size": 1000}


def _batches(values: list[bytes], size: int) -> list[list[bytes]]:
    return [values[i:i + size] for i in range(0, len(values), size)]


def _assert_same(a, b) -> None:
    np.testing.assert_array_equal(a.ok, b.ok)
    assert a.rejected == b.rejected
    assert a.rows.keys() == b.rows.keys()
    for key in a.rows:
        np.testing.assert_array_equal(a.rows[key], b.rows[key])


@pytest.mark.parametrize("family, params, values", [
    ("linreg", LINREG, SyntheticRegressionSource(dimension=3, seed=4, malformed_fraction=0.2).generate(600)),
    # LDA resamples every document from the model's seeded generator: the worker's copy draws the same
    ("lda", {"vocabulary": [f"w{i}" for i in range(40)], "dataset_size": 100, "n_topics": 3, "doc_length": 12,
             "seed": 9},
     SyntheticLdaSource(n_topics=3, vocabulary_size=40, seed=2, malformed_fraction=0.1).generate(300)),
])
def test_worker_decodes_exactly_as_the_pipeline_process_in_submission_order(family, params, values):
    inline = InlineDecoder(model_class(family)(**params))
    worker = ProcessDecoder(family, params)
    try:
        batches = _batches(values, 70)
        for batch in batches[:2]:  # two in flight: results come back oldest first
            worker.submit(batch)
        got = [worker.result(), worker.result()]
        for batch in batches[2:]:
            worker.submit(batch)
            got.append(worker.result())
    finally:
        worker.close()
    expected = []
    for batch in batches:
        inline.submit(batch)
        expected.append(inline.result())
    assert any(b.rejected for b in expected) and any(b.ok.any() for b in expected)
    for a, b in zip(got, expected):
        _assert_same(a, b)


def test_worker_that_cannot_build_the_model_fails_its_first_result_with_the_reason():
    worker = ProcessDecoder("linreg", {"dim": 0, "dataset_size": 10})
    try:
        with pytest.raises(DecoderError, match=r"building the linreg model failed: .*dim"):
            worker.submit([b"{}"])
            worker.result()
    finally:
        worker.close()


def test_a_dead_worker_is_an_error_not_a_hang():
    worker = ProcessDecoder("linreg", LINREG)
    try:
        os.kill(worker._proc.pid, signal.SIGKILL)
        worker._proc.wait(10)
        with pytest.raises(DecoderError, match="exited|gone"):
            worker.submit([b'{"x": [0, 0, 0], "y": 1}'] * 10)
            worker.result()
    finally:
        worker.close()


def test_make_decoder_refuses_other_worker_counts():
    model = model_class("linreg")(**LINREG)
    assert isinstance(make_decoder(0, model, "linreg", LINREG), InlineDecoder)
    with pytest.raises(ValueError, match="0 or 1"):
        make_decoder(2, model, "linreg", LINREG)


def _config(decode_workers: int, tmp_path) -> dict:
    return {
        "model": {"family": "linreg", "params": LINREG},
        "privacy": {"epsilon": 50.0, "noise_multiplier": 3.0, "seed": 11, "ledger": {"type": "memory"}},
        "sampling": {"method": "fixed", "reservoir": 150, "batch_size": 40},
        "schedule": {"every_records": 90},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_max_records": 64, "poll_timeout_s": 0.01, "publish_interval_s": 0.0,
                    "decode_workers": decode_workers},
    }


def test_pipeline_with_a_decode_worker_publishes_what_the_inline_pipeline_publishes(tmp_path):
    """One batch in flight changes nothing a seeded run releases: same updates at the same
    arrival counts, same dead letters, same messages (same noise)."""
    values = SyntheticRegressionSource(dimension=3, seed=5, malformed_fraction=0.1).generate(1000)
    runs = []
    for workers in (0, 1):
        sink, dead = MemorySink(), MemoryDeadLetterSink()
        app = Application.from_config(config_from_dict(_config(workers, tmp_path), env={}),
                                      source=MemorySource(values), sink=sink, dead_letter=dead)
        stats = app.run()
        runs.append((stats, sink.messages, [(d.record.value, d.reason) for d in dead.letters]))
    (s0, m0, d0), (s1, m1, d1) = runs
    assert s0.records == s1.records == 1000 and s0.updates == s1.updates > 5
    assert d0 == d1 and d0
    assert [m["version"] for _, m in m0] == [m["version"] for _, m in m1]
    assert json.dumps([m["natural_parameters"] for _, m in m0]) == json.dumps([m["natural_parameters"] for _, m in m1])


def test_decode_workers_is_checked_at_start(tmp_path):
    with pytest.raises(ConfigError, match=r"^runtime\.decode_workers: must be 0 or 1"):
        config_from_dict(_config(3, tmp_path), env={})


def test_run_tunes_the_garbage_collector_only_while_it_runs(tmp_path):
    before = gc.get_threshold()
    seen = []
    app = Application.from_config(config_from_dict(_config(0, tmp_path), env={}),
                                  source=MemorySource(SyntheticRegressionSource(dimension=3).generate(300)),
                                  sink=MemorySink(), dead_letter=MemoryDeadLetterSink(),
                                  progress=lambda a: seen.append((gc.get_threshold()[0], gc.get_freeze_count())))
    app.run()
    assert seen and all(t0 >= 20 * 64 and frozen > 0 for t0, frozen in seen)
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


_TRICKY = [b'{"x": [NaN, 1, 2], "y": 1}', b'{"x": [1, 2, 3], "y": 123456789012345678901}', b"[" * 5000,
           b'{"x": [1, 2, 3], "x": [0.5, 0, 0], "y": 0}', b'{"x": [1, 2, "3"], "y": 1}', b'{"x": [1, 2], "y": 1}',
           b'{"x": [1, 2, 3], "y": 0.5}', b'\xff{"x": [1, 2, 3], "y": 1}',
           b'{"x": [1, 2, ' + b"9" * 400 + b'], "y": 1}', b'{"x": [1, 2, 3], "y": Infinity}', b"",
           b'{"x": [0.' + b"3" * 30 + b", 0, 0], \"y\": 1}"]


@pytest.mark.parametrize("family, params", [("linreg", LINREG), ("logistic", {"dim": 3, "dataset_size": 1000})])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_batch_with_one_percent_bad_records_gives_what_each_record_gives_alone(family, params, seed, monkeypatch):
    """Whole-batch decoding and validation (orjson in one pass, per-document json only for the bad
    ones) gives the rows and the (arrival, reason, detail) rejections of the per-record reference:
    every record decoded by json and validated on its own."""
    from stream_vips.core.data.decoding import decode_batch
    from stream_vips.records import decoding as records_decoding  # the decoder's internals

    rng = np.random.default_rng(seed)
    values = SyntheticRegressionSource(dimension=3, seed=seed, malformed_fraction=0.01).generate(5000)
    if family == "logistic":
        values = [v.replace(b'"y": -', b'"y": ').split(b'"y": ')[0] + b'"y": %d}' % (i % 2) if b'"y": ' in v else v
                  for i, v in enumerate(values)]
    for i, k in zip(rng.choice(5000, size=len(_TRICKY), replace=False).tolist(), range(len(_TRICKY))):
        values[i] = _TRICKY[k]
    model = model_class(family)(**params)
    got = decode_batch(model, values)
    with monkeypatch.context() as m:
        m.setattr(records_decoding, "_fast_loads", json.loads)
        alone = [decode_batch(model, [v]) for v in values]
    np.testing.assert_array_equal(got.ok, [a.ok[0] for a in alone])
    assert got.rejected == [(i, reason, detail) for i, a in enumerate(alone) for _, reason, detail in a.rejected]
    for key in got.rows:
        np.testing.assert_array_equal(got.rows[key], np.concatenate([a.rows[key] for a in alone]))
    assert 0.005 < 1 - got.ok.mean() < 0.05 and len({reason for _, reason, _ in got.rejected}) >= 5
