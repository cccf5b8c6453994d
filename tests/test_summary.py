"""The posterior summary block of a model message (``summary``, docs/model-topic.md).

* every registered family states one, schema-valid, in plain JSON numbers, with a predictive rule;
* it is a function of the message's hyperparameters and arrays alone (post-processing of released
  values): the same arrays under another id, time and privacy report give the same block, another
  array gives another block, and the live model's summary equals the rebuilt one's;
* the rule it states, evaluated from the block's numbers alone, gives the family's own predictions
  (logistic, linreg both noises, sep_probit, sep_mixture, dpvi, sgld, ops);
* messages written before the block existed (committed fixtures) still read, and gain the block.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.special import expit, ndtr, softmax

from stream_vips import messages
from stream_vips.client import check_message, posterior_from_message
from stream_vips.models import model_class
from stream_vips.models.posterior import summary_of, with_summary
from test_family_conformance import FAMILIES, build, noisy_updates

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "messages"


def report(private: bool = True, steps: int = 5) -> dict:
    if private:
        return messages.privacy_report(epsilon_spent=0.5, delta=1e-5, epsilon_budget=1.0, accountant="pld",
                                       sampling="poisson", q=0.1, noise_multiplier=2.0, steps=steps,
                                       halted=False, seeded=True)
    return messages.privacy_report(epsilon_spent=math.inf, delta=1e-5, epsilon_budget=math.inf, accountant="none",
                                   sampling="poisson", q=0.5, noise_multiplier=0.0, steps=steps, halted=False,
                                   seeded=True, private=False)


def published(family: str, **params) -> tuple[dict, object]:
    """A message (with its summary) of a model of ``family`` after noisy updates, and the model."""
    model, data = build(family)
    if params:
        model = type(model)(**{**model.hyperparameters(), **params})
    if model_class(family).engine_refusal is None:
        noisy_updates(model, data)
    msg = with_summary(messages.build_message("m", family, model.hyperparameters(), 4, model.state(), report()))
    return messages.loads(messages.dumps(msg)), model


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_states_a_schema_valid_summary_in_plain_json(family):
    msg, model = published(family)
    block = msg["summary"]
    assert block["family"] == family and block["version"] == 4
    assert block["kind"] in {"coefficients", "mixture", "topics", "network"}, block  # not "none"
    assert len(block["predictive"]) > 20 and "\n" not in block["predictive"]
    text = json.dumps(block, allow_nan=False)  # strict JSON: no NaN, no infinity
    assert "base64" not in text
    # the live model says what the rebuilt one says: nothing in it but the released state
    assert block == json.loads(json.dumps(summary_of(msg)))
    live = json.loads(json.dumps({"family": family, "version": 4, **_plain(model.summary())}))
    assert block == live


def _plain(value):
    from stream_vips.models.summaries import plain

    return plain(value)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_summary_is_a_function_of_the_message_arrays_alone(family):
    msg, _ = published(family)
    other = copy.deepcopy(msg)
    other.update(model_id="another", created_at="2001-01-01T00:00:00Z", privacy=report(private=False, steps=99))
    assert summary_of(other) == summary_of(msg) == msg["summary"]
    # another released state moves it: the block reads the arrays
    moved = messages.build_message("m", family, msg["hyperparameters"], 4, _another_state(family, msg), report())
    assert summary_of(moved) != msg["summary"]


def _another_state(family: str, msg: dict) -> dict:
    """A state of the message's shapes that differs from its arrays: another data set's updates (the
    released sample moved, for ops, which updates outside the engine)."""
    state = messages.decode_state(msg)
    if model_class(family).engine_refusal is not None:
        return {k: v + 0.25 if k == "theta" else v for k, v in state.items()}
    model, data = build(family, seed=1)
    noisy_updates(model, data)
    other = model.state()
    assert set(other) == set(state) and any(not np.array_equal(other[k], state[k]) for k in state)
    return other


def _x(d: int, n: int = 7, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=0.8, size=(n, d))


def _clip(X: np.ndarray, bound: float | None) -> np.ndarray:
    if bound is None:
        return X
    norms = np.linalg.norm(X, axis=1, keepdims=True)
    return X * np.minimum(1.0, bound / np.maximum(norms, 1e-300))


@pytest.mark.parametrize("family", ["logistic", "dpvi"])
def test_the_probit_rule_of_the_summary_gives_the_model_probabilities(family):
    msg, _ = published(family)
    s, model = msg["summary"], posterior_from_message(msg).model
    X = _x(len(s["mean"]))
    F = _clip(X, s["x_clip"])
    cov = np.asarray(s["covariance"]) if "covariance" in s else np.diag(np.square(s["sd"]))
    s2 = np.einsum("ij,jk,ik->i", F, cov, F)
    p = 1 / (1 + np.exp(-(F @ np.asarray(s["mean"])) / np.sqrt(1 + s["probit_scale"] * s2)))
    assert s["probit_scale"] == math.pi / 8
    np.testing.assert_allclose(p, model.predict_proba(X), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("noise", ["known", "gamma"])
def test_the_linreg_rule_gives_the_predictive_mean_and_variance(noise):
    msg, _ = published("linreg", noise=noise)
    s, model = msg["summary"], posterior_from_message(msg).model
    X = _x(len(s["mean"]))
    F = _clip(X, s["x_clip"])
    mean = F @ np.asarray(s["mean"])
    if noise == "known":
        var = s["noise_variance"] + np.einsum("ij,jk,ik->i", F, np.asarray(s["covariance"]), F)
    else:
        a, b = s["noise_shape"], s["noise_rate"]
        scale2 = b / a * (1 + np.einsum("ij,jk,ik->i", F, np.asarray(s["scale_matrix"]), F))
        var = scale2 * (2 * a) / (2 * a - 2)
    m_model, v_model = model.predictive(X)
    np.testing.assert_allclose(mean, m_model, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, v_model, rtol=1e-10)


def test_the_sep_probit_rule_gives_the_model_probabilities():
    msg, _ = published("sep_probit")
    s, model = msg["summary"], posterior_from_message(msg).model
    X = _x(model.n_features)
    F = _clip(X, s["x_clip"])
    if s["intercept"]:
        F = np.hstack([F, np.ones((len(F), 1))])
    s2 = np.einsum("ij,jk,ik->i", F, np.asarray(s["covariance"]), F)
    np.testing.assert_allclose(ndtr(F @ np.asarray(s["mean"]) / np.sqrt(1 + s2)), model.predict_proba(X), rtol=1e-12)


def test_the_mixture_rule_gives_the_model_responsibilities():
    msg, _ = published("sep_mixture")
    s, model = msg["summary"], posterior_from_message(msg).model
    X = _x(model.dim)
    logp = []
    for w, m, c, v in zip(s["weights"], s["means"], s["covariances"], s["variances"], strict=True):
        S = np.asarray(c) + np.diag(v)
        diff = X - np.asarray(m)
        maha = np.einsum("ij,jk,ik->i", diff, np.linalg.inv(S), diff)
        logp.append(math.log(w) - 0.5 * (maha + np.linalg.slogdet(S)[1] + model.dim * math.log(2 * math.pi)))
    np.testing.assert_allclose(softmax(np.array(logp).T, axis=1), model.responsibilities(X), rtol=1e-10, atol=1e-14)


def test_the_sample_rules_of_sgld_and_ops_give_the_model_probabilities():
    for family in ("sgld", "ops"):
        msg, _ = published(family)
        s, model = msg["summary"], posterior_from_message(msg).model
        F = _clip(_x(len(s["mean"])), s["x_clip"])
        samples = np.asarray(s.get("samples", [s["mean"]]))
        np.testing.assert_allclose(expit(F @ samples.T).mean(axis=1), model.predict_proba(F), rtol=1e-12)


def test_the_lda_summary_carries_the_topic_word_means_and_top_words():
    msg, _ = published("lda")
    s, model = msg["summary"], posterior_from_message(msg).model
    beta = np.asarray(s["topic_word_means"])
    np.testing.assert_allclose(beta, model.topics(), rtol=1e-15)
    np.testing.assert_allclose(beta.sum(axis=1), 1.0, rtol=1e-12)
    vocab = msg["hyperparameters"]["vocabulary"]
    for k, (words, means) in enumerate(zip(s["top_words"], s["top_word_means"], strict=True)):
        assert means == sorted(means, reverse=True)
        assert [beta[k, vocab.index(w)] for w in words] == means


def test_a_large_lda_summary_omits_the_full_table_and_says_where_it_is():
    from stream_vips.models.lda import LDA
    from stream_vips.models.summaries import TABLE_LIMIT

    vocab = [f"w{i}" for i in range(TABLE_LIMIT // 2 + 1)]
    model = LDA(vocabulary=vocab, n_topics=2, doc_length=10, dataset_size=100)
    msg = with_summary(messages.build_message("m", "lda", model.hyperparameters(), 0, model.state(), report()))
    assert "topic_word_means" not in msg["summary"]
    assert "lambda" in msg["summary"]["notes"][0] and len(msg["summary"]["top_words"][0]) == 8


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.v1-before-summary.json")), ids=lambda p: p.name)
def test_messages_written_before_the_summary_still_read_and_gain_it(path):
    msg = messages.loads(path.read_bytes())
    assert "summary" not in msg
    published_model = posterior_from_message(check_message(msg))
    assert published_model.version == msg["version"] and published_model.private
    block = with_summary(msg)["summary"]
    assert block["family"] == msg["family"] and block["predictive"]


def test_a_summary_that_fails_still_lets_the_release_out(monkeypatch):
    from stream_vips.models.linreg import LinearRegression

    def broken(self):
        raise np.linalg.LinAlgError("Singular matrix")

    monkeypatch.setattr(LinearRegression, "summary", broken)
    model = LinearRegression(dim=2, dataset_size=10)
    msg = with_summary(messages.build_message("m", "linreg", model.hyperparameters(), 0, model.state(), report()))
    assert msg["summary"]["kind"] == "none" and "LinAlgError: Singular matrix" in msg["summary"]["notes"][0]


# -- how far the model moved from its prior (post-processing of the released model) --------------


def test_movement_is_the_mean_distance_from_the_prior_mean_in_prior_sds():
    from stream_vips.models.summaries import movement

    m = movement({"kind": "coefficients", "mean": [1.0, -0.5, 0.0]}, (np.zeros(3), np.asarray(0.5)))
    # |m - 0| / 0.5 = (2, 1, 0): rms sqrt(5/3), largest 2, only 2 is beyond 1 sd
    assert m["known"] and m["count"] == 3 and m["beyond_one_sd"] == 1
    assert m["rms"] == pytest.approx(math.sqrt(5 / 3)) and m["max"] == pytest.approx(2.0)
    mix = movement({"kind": "mixture", "means": [[1.0, 1.0], [-1.0, 3.0]]}, (np.asarray([0.0, 1.0]), np.asarray(2.0)))
    # (means - (0, 1)) / 2 = ((0.5, 0), (-0.5, 1)): rms sqrt(1.5 / 4), largest 1, none beyond 1
    assert mix["max"] == pytest.approx(1.0) and mix["rms"] == pytest.approx(math.sqrt(1.5 / 4))
    assert mix["beyond_one_sd"] == 0
    for summary, prior in [({"kind": "topics"}, (np.zeros(1), np.ones(1))),
                           ({"kind": "coefficients", "mean": [1.0, 2.0]}, (np.zeros(3), np.asarray(1.0))),
                           ({"kind": "coefficients", "mean": [1.0]}, "no prior")]:
        out = movement(summary, prior)
        assert out["known"] is False and out["line"].startswith("how far the model moved from its prior cannot be said")


def test_each_family_s_prior_location_is_its_stated_prior():
    linreg = model_class("linreg")(dim=2, dataset_size=10, prior_precision=4.0, prior_mean=[1.0, -1.0])
    mean, sd = linreg.prior_location()
    assert mean.tolist() == [1.0, -1.0] and float(sd) == pytest.approx(0.5)
    gamma = model_class("linreg")(dim=2, dataset_size=10, prior_precision=4.0, noise="gamma", a0=2.0, b0=8.0)
    # the Student t marginal's scale sqrt(b0 / (a0 alpha))
    assert float(gamma.prior_location()[1]) == pytest.approx(math.sqrt(8.0 / (2.0 * 4.0)))
    logistic = model_class("logistic")(dim=3, dataset_size=10, a0=2.0, b0=8.0)
    assert float(logistic.prior_location()[1]) == pytest.approx(2.0)
    # an untrained model sits at its prior mean: it moved 0
    assert model_class("linreg")(dim=2, dataset_size=10, prior_mean=[1.0, -1.0]).movement()["max"] == pytest.approx(0.0)


@pytest.mark.parametrize("family", ["lda", "sbn"])
def test_families_without_coefficient_means_say_movement_cannot_be_said(family):
    model, _ = build(family)
    assert model.movement()["known"] is False
