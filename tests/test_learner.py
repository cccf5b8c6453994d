"""PrivateLearner: the I/O-free core and the public API's notebook defaults."""

from __future__ import annotations

import numpy as np
import pytest

import stream_vips
from stream_vips import ConfigError, PrivateLearner, StreamVipsError
from stream_vips.core.learner import StateMismatch
from stream_vips.privacy.ledger import LedgerMismatch


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


def test_finite_data_smaller_than_the_reservoir_gives_no_model_and_says_what_to_do():
    """The reservoir keeps its configured size (privacy rule 5: no step before it is full); a
    finite feed that ends without a model says so, and so does asking for the model."""
    lrn = learner()
    with pytest.warns(UserWarning, match="learn_many ended without a released model") as caught:
        lrn.learn_many(linreg_data(300))
    assert len(caught) == 1
    with pytest.raises(StreamVipsError) as exc:
        _ = lrn.posterior
    message = str(exc.value)
    assert str(caught[0].message) == "learn_many ended without a released model: " + message.split(": ", 1)[1]
    assert "300 records fed, 0 rejected; updates have not halted" in message
    assert "the reservoir is not yet full: it holds 300 of 500 records" in message
    assert "feed at least 200 more records, pass a smaller reservoir=" in message and "stream_vips.fit" in message
    assert "\n" not in message and lrn.epsilon_spent == 0.0 and not lrn.halted


def test_a_full_reservoir_before_its_first_trigger_says_to_feed_more_or_step():
    lrn = learner(every_records=1000)
    with pytest.warns(UserWarning, match=r"the reservoir is full and the next step is due after 400 more arrivals "
                                         r"\(every_records=1000\): feed more records, or call step\(\) to take "
                                         r"one now; a finite table is fitted whole, with every planned step, by "
                                         r"stream_vips\.fit"):
        lrn.learn_many(linreg_data(600))
    assert lrn.step() is not None  # explicitly: the reservoir is full, so this is a release
    assert lrn.posterior.model.predictive(np.zeros((1, 3)))[0].shape == (1,)


def test_no_model_says_how_many_records_were_rejected_why_the_learner_halted_and_what_to_do():
    """No dim given (the linreg default is 5) on 3-d records: every record is rejected."""
    X, y = linreg_data(800)
    records = [{"x": xi.tolist(), "y": float(yi)} for xi, yi in zip(X, y)]
    lrn = PrivateLearner("linreg", epsilon=3.0, reservoir=500, batch_size=250, every_records=250, planned_steps=10)
    with pytest.warns(UserWarning, match="without a released model"):
        lrn.learn_many(records)
    with pytest.raises(StreamVipsError) as exc:
        _ = lrn.posterior
    message = str(exc.value)
    assert message.startswith("no private step has been taken yet, so there is no released model: "
                              "800 records fed (500 reached the reservoir before updates halted), 800 rejected "
                              "(wrong_shape (800)); updates halted: 100% of the reservoir's slots hold rejected "
                              "arrivals")
    assert message.endswith("no dim= was given, so the linreg default dim=5 applies: pass dim= (the length of "
                            "your records' x)")
    assert "\n" not in message and lrn.epsilon_spent == 0.0 and len(lrn.ledger.events()) == 0


@pytest.mark.parametrize("form", ["arrays", "X", "dataframe"])
def test_array_columns_that_do_not_match_a_default_dim_are_refused_before_anything_is_fed(form):
    """The column count of arrays is public schema: with no dim given it is checked at once."""
    X, y = linreg_data(800)
    data = {"arrays": (X, y), "X": X}.get(form)
    if form == "dataframe":
        pd = pytest.importorskip("pandas")
        data = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "y": y})
    lrn = PrivateLearner("linreg", epsilon=3.0, reservoir=500, batch_size=250, every_records=250, planned_steps=10)
    with pytest.raises(ConfigError, match=r"^model.params.dim: not given, so the linreg default dim=5 applies, but "
                                          r"the data has 3 columns: pass dim=3 \(nothing was fed\)$"):
        lrn.learn_many(data)
    assert lrn.reservoir.seen == 0 and not lrn.rejected and not lrn.halted and lrn.epsilon_spent == 0.0
    assert learner(dim=3).learn_many((X, y)).steps_taken == 2  # a given dim is used as given: steps at 500, 750


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
    with pytest.warns(UserWarning, match="without a released model"):
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
    with pytest.warns(UserWarning, match="updates halted: 20% of the reservoir's slots hold rejected arrivals"):
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


def test_learn_many_takes_an_array_of_images_for_sbn():
    """A lone array fills the family's vector field (sbn reads images from ``y``), as in fit: it
    was sent as ``x`` and every image was rejected as missing_field."""
    Y = (np.random.default_rng(2).random((300, 6)) < 0.4).astype(np.uint8)
    learner = PrivateLearner("sbn", n_visible=6, n_latent=2, dataset_size=300, reservoir=200, batch_size=100,
                             every_records=100, planned_steps=5, epsilon=1.0, delta=1e-5, seed=1)
    learner.learn_many(Y)
    assert learner.steps_taken > 0 and not learner.rejected


def test_learn_many_reads_array_data_once(monkeypatch):
    """learn_many converted the arrays twice (its column check, then records_of)."""
    import stream_vips.core.learner as learner_module

    calls, real = [], learner_module.tabular

    def counting(data, **kw):
        calls.append(type(data).__name__)
        return real(data, **kw)

    monkeypatch.setattr(learner_module, "tabular", counting)
    X, y = linreg_data(600)
    assert learner().learn_many((X, y)).steps_taken == 1 and calls == ["tuple"]



def test_a_budget_too_loose_to_calibrate_at_a_tiny_rate_is_a_config_error():
    """At q = 1e-6 even z near the accountants' floor meets epsilon 1e4: the calibration stops at
    that floor with a clear error instead of driving the PLD accountant into an overflow."""
    with pytest.raises(ConfigError, match=r"^privacy\.noise_multiplier: cannot calibrate: .*too loose"):
        PrivateLearner("linreg", dim=2, epsilon=1e4, reservoir=1_000_000, batch_size=1, sampling="poisson",
                       planned_steps=1)


def test_a_ledger_path_that_cannot_be_created_is_a_config_error(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ConfigError, match=r"^privacy\.ledger\.path: cannot open .*file/ledger\.jsonl"):
        PrivateLearner("linreg", dim=2, ledger_path=tmp_path / "file" / "ledger.jsonl")


def test_non_private_is_the_python_spelling_and_mode_is_deprecated_with_what_to_write():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new spelling warns about nothing
        new = learner(non_private=True)
    assert new.engine.non_private and new.ledger is None
    assert new.config.privacy.mode == "non_private"
    assert not learner(non_private=False).engine.non_private
    with pytest.warns(DeprecationWarning, match=r"write non_private=True \(privacy.mode stays"):
        old = learner(mode="non_private")
    assert old.engine.non_private
    with pytest.warns(DeprecationWarning, match="write non_private=False"):
        assert not learner(mode="private").engine.non_private


@pytest.mark.parametrize("kw", [dict(non_private=True, mode="private"), dict(non_private=False, mode="non_private"),
                                dict(non_private="yes")])
def test_non_private_and_mode_that_disagree_are_one_line_naming_the_key(kw):
    with pytest.raises(ConfigError, match="^non_private") as info:
        learner(**kw)
    assert "\n" not in str(info.value)
