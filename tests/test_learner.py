"""PrivateLearner: the I/O-free core and the public API's notebook defaults."""

from __future__ import annotations

import numpy as np
import pytest

import stream_vips
from stream_vips import ConfigError, PrivateLearner, StreamVipsError
from stream_vips.learner import StateMismatch
from stream_vips.privacy.ledger import FileLedger, LedgerMismatch


def linreg_data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.5, 0.5, size=(n, 3))
    return X, X @ np.array([0.6, -0.3, 0.2]) + 0.05 * rng.standard_normal(n)


def learner(**kw) -> PrivateLearner:
    opts = dict(dim=3, epsilon=3.0, reservoir=500, batch_size=250, every_records=250, planned_steps=10, seed=2)
    opts.update(kw)
    return PrivateLearner("linreg", **opts)


def test_the_public_api_is_one_import():
    assert {"PrivateLearner", "fit", "Application", "StreamVipsError", "ConfigError"} <= set(stream_vips.__all__)
    assert issubclass(ConfigError, StreamVipsError) and issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("form", ["arrays", "dicts", "iterable", "dataframe"])
def test_every_data_form_gives_the_same_model(form):
    X, y = linreg_data(2000)
    data = {"arrays": (X, y),
            "dicts": [{"x": xi.tolist(), "y": float(yi)} for xi, yi in zip(X, y)],
            "iterable": ({"x": xi.tolist(), "y": float(yi)} for xi, yi in zip(X, y))}.get(form)
    if form == "dataframe":
        pd = pytest.importorskip("pandas")
        data = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": y})
    ref = learner().learn_many((X, y))
    got = learner().learn_many(data)
    assert got.steps_taken == ref.steps_taken == 7  # full at 500, then a step per 250 arrivals
    for name, value in ref.model.state().items():
        np.testing.assert_array_equal(got.model.state()[name], value)


def test_notebook_defaults_keep_the_ledger_in_memory_and_stop_when_the_budget_is_spent(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    X, y = linreg_data(20_000)
    lrn = learner().learn_many((X, y))
    assert lrn.halted and lrn.steps_taken == 10  # the planned steps, then the budget refuses
    assert lrn.epsilon_spent <= 3.0
    assert list(tmp_path.iterdir()) == []  # nothing written to the working directory
    report = lrn.privacy_report()
    assert report["halted"] and report["ledger_id"] == lrn.ledger.ledger_id and report["steps"] == 10
    mean, var = lrn.posterior.model.predictive(np.array([[0.5, 0.0, 0.0]]))
    assert abs(mean[0] - 0.3) < 0.15 and var[0] > 0


def test_no_posterior_before_the_first_step():
    lrn = learner().learn_many(linreg_data(100))
    with pytest.raises(StreamVipsError, match="holds 100 of 500 records"):
        lrn.posterior


def test_a_ledger_path_makes_spending_durable_and_state_is_bound_to_it(tmp_path):
    X, y = linreg_data(1500)
    first = learner(ledger_path=tmp_path / "ledger.jsonl").learn_many((X, y))
    state, spent = first.state(), first.epsilon_spent
    first.close()
    again = learner(ledger_path=tmp_path / "ledger.jsonl")
    assert again.epsilon_spent == pytest.approx(spent, rel=1e-12)  # a new learner never starts at 0
    again.load_state(state)
    assert again.reservoir.seen == 1500
    again.close()
    other = learner(ledger_path=tmp_path / "other.jsonl")
    with pytest.raises(LedgerMismatch, match="deleted or replaced"):
        other.load_state(state)  # state paid for by another ledger
    other.close()
    with pytest.raises(StateMismatch, match="family 'linreg'"):
        PrivateLearner("logistic", dim=3, epsilon=1.0, reservoir=500, batch_size=50, planned_steps=5).load_state(state)


def test_a_reservoir_of_mostly_rejected_records_halts_before_spending():
    """dim 4 on 3-dimensional data: every record is rejected; no step spends budget on nothing."""
    X, y = linreg_data(5000)
    lrn = PrivateLearner("linreg", dim=4, epsilon=1.0, reservoir=1000, batch_size=100, every_records=500,
                         planned_steps=8).learn_many((X, y))
    assert lrn.halted and lrn.steps_taken == 0 and lrn.epsilon_spent == 0.0 and len(lrn.ledger.events()) == 0
    assert "100% of the reservoir's slots hold rejected arrivals" in lrn.halt_reason
    assert "top rejection reasons: wrong_shape (5000)" in lrn.halt_reason


def test_the_rejected_fraction_threshold_is_configurable():
    X, y = linreg_data(3000)
    data = [{"x": xi.tolist(), "y": float(yi)} if i % 5 else {"x": "bad"} for i, (xi, yi) in enumerate(zip(X, y))]
    tolerant = learner(max_rejected_fraction=0.5).learn_many(data)  # 20% empty slots: steps go on
    assert tolerant.steps_taken == 10  # 20% empty slots: the planned steps all happen
    strict = PrivateLearner("linreg", dim=3, epsilon=3.0, reservoir=500, batch_size=250, every_records=250,
                            planned_steps=10, seed=2, max_rejected_fraction=0.1).learn_many(data)
    assert strict.halted and strict.steps_taken == 0
    with pytest.raises(ConfigError, match="sampling.max_rejected_fraction"):
        learner(max_rejected_fraction=1.5)


def test_bad_options_name_the_key():
    with pytest.raises(ConfigError, match="model.family: unknown family 'linear'"):
        PrivateLearner("linear", dim=3)
    with pytest.raises(ConfigError, match="sampling.batch_size"):
        learner(batch_size=5000)


def test_a_with_block_closes_the_ledger_and_a_second_open_names_this_process(tmp_path):
    path = tmp_path / "ledger.jsonl"
    with learner(ledger_path=path) as first:
        first.learn_many(linreg_data(600))
        with pytest.raises(StreamVipsError, match="held by this process .*close the earlier PrivateLearner"):
            learner(ledger_path=path)  # the notebook cell run again while the first learner is open
    again = learner(ledger_path=path)  # the with block released the lock
    assert again.epsilon_spent == pytest.approx(first.epsilon_spent, rel=1e-12) and first.epsilon_spent > 0
    again.close()


@pytest.mark.parametrize("text", ["hello", b'{"x": [0.1, 0.2, 0.3], "y": 1.0}', bytearray(b"hello")])
def test_a_string_is_not_a_sequence_of_records(text):
    lrn = learner()
    with pytest.raises(StreamVipsError, match=f"not one {type(text).__name__} .*pass a list of records") as exc:
        lrn.learn_many(text)
    assert "\n" not in str(exc.value)
    assert lrn.reservoir.seen == 0 and not lrn.rejected  # nothing fed, nothing rejected
