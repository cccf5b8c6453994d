"""The scikit-learn estimators (stream_vips.estimators): scikit-learn's own checks, the budget,
the way back from a model message, Pipeline and clone, and the refusals they share with fit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from stream_vips.errors import FitError
from stream_vips.estimators import (
    PrivateBNNRegressor,
    PrivateGaussianMixture,
    PrivateLDA,
    PrivateLinearRegression,
    PrivateLogisticRegression,
    PrivateProbitClassifier,
    PrivateSigmoidBeliefNetwork,
)

#: Instances for scikit-learn's checks: they test the API, not accuracy, so the checks' small data
#: get a large budget and the SEP families and sbn a short run (their rules take 2,000 and 20 steps).
CHECKED = [
    PrivateLogisticRegression(epsilon=50.0, x_bound=4.0),
    PrivateProbitClassifier(epsilon=50.0, steps=60),
    PrivateLinearRegression(epsilon=50.0, x_bound=5.0, y_bound=4.0),
    PrivateBNNRegressor(epsilon=50.0, steps=400),
    PrivateGaussianMixture(epsilon=50.0, steps=60),
    PrivateLDA(epsilon=50.0, n_components=3, steps=5),
    PrivateSigmoidBeliefNetwork(epsilon=50.0, n_components=3, steps=3),
]


@parametrize_with_checks(CHECKED, expected_failed_checks=lambda est: est.__sklearn_tags__().expected_failed_checks)
def test_sklearn_checks(estimator, check):
    check(estimator)


# ------------------------------------------------------------------------------------------- data


def _classification(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.uniform(-0.5, 0.5, (n, 2))
    y = (X @ np.array([3.0, -2.0]) + 0.2 + 0.3 * rng.logistic(size=n) > 0).astype(int)
    return X, y


def _regression(n: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = np.array([0.8, -0.5])
    X = rng.uniform(-0.5, 0.5, (n, 2))
    return X, X @ w + 0.1 + 0.2 * rng.normal(size=n), w


# ---------------------------------------------------------------------------------- the budget


def test_fit_spends_the_budget_once_and_reports_it():
    X, y = _classification()
    clf = PrivateLogisticRegression(epsilon=1.0, delta=1e-5, random_state=0).fit(X, y)
    # fit calibrates z to spend the budget within (1 + 1e-3)^2 (docs/fit.md)
    assert 1.0 / 1.001**2 <= clf.epsilon_spent_ <= 1.0
    privacy = clf.model_message_["privacy"]
    assert privacy["seeded"] is True and privacy["private"] is True
    assert clf.privacy_report_["budget"]["epsilon_spent"] == pytest.approx(clf.epsilon_spent_)
    baseline = PrivateLogisticRegression(non_private=True, random_state=0).fit(X, y)
    assert math.isinf(baseline.epsilon_spent_) and baseline.model_message_["privacy"]["private"] is False


def test_the_estimator_is_fit_with_a_public_design():
    """Without an intercept and with x_bound 1 the estimator's fit is exactly stream_vips.fit's."""
    from stream_vips import fit

    X, y = _classification(800)
    clf = PrivateLogisticRegression(fit_intercept=False, random_state=3).fit(X, y)
    result = fit((X, y.astype(float)), "logistic", epsilon=1.0, delta=1e-5, seed=3)
    assert clf.model_message_["natural_parameters"] == result.message["natural_parameters"]
    np.testing.assert_allclose(clf.predict_proba(X)[:, 1], result.posterior.model.predict_proba(X))


# -------------------------------------------------------------------------- messages and pickle


def test_from_message_and_pickle_give_the_same_predictions(tmp_path):
    import json
    import pickle

    X, y = _classification()
    clf = PrivateLogisticRegression(random_state=0).fit(X, y)
    again = PrivateLogisticRegression.from_message(json.loads(json.dumps(clf.model_message_)))
    np.testing.assert_allclose(again.predict_proba(X), clf.predict_proba(X))
    assert again.epsilon_spent_ == pytest.approx(clf.epsilon_spent_)
    np.testing.assert_allclose(pickle.loads(pickle.dumps(clf)).predict_proba(X), clf.predict_proba(X))
    with pytest.raises(FitError, match="a logistic model, but PrivateLinearRegression reads linreg"):
        PrivateLinearRegression.from_message(clf.model_message_)


def test_a_model_written_by_the_command_is_scored_as_an_estimator(tmp_path):
    import json

    from stream_vips.cli import main

    X, y = _classification(1000)
    data, out = tmp_path / "data.jsonl", tmp_path / "model.json"
    data.write_text("".join(json.dumps({"x": [*row, 1.0], "y": int(label)}) + "\n" for row, label in zip(X, y)))
    assert main(["fit", "--family", "logistic", "--dim", "3", "--epsilon", "1", "--delta", "1e-5", "--seed", "0",
                 "--out", str(out), str(data)]) == 0
    clf = PrivateLogisticRegression.from_message(json.loads(out.read_text()), fit_intercept=False)
    assert clf.score(np.hstack([X, np.ones((len(X), 1))]), y) > 0.85


# ------------------------------------------------------------------------- the Bayesian answers


def test_regressor_std_intervals_and_samples_agree():
    X, y, w = _regression()
    reg = PrivateLinearRegression(non_private=True, y_bound=3.0, noise="gamma", random_state=0).fit(X, y)
    lo, hi = reg.credible_intervals(0.99).T
    # no noise and no clipping (|x| <= 0.71 < 1, |y| < 3): the exact posterior, whose 99% intervals
    # hold the true coefficients and intercept (each misses with probability 0.01)
    assert np.all(lo <= np.append(w, 0.1)) and np.all(np.append(w, 0.1) <= hi)
    draws = reg.sample_posterior(4000, random_state=0)
    sd = (hi - lo) / (2 * 2.5758)
    # the mean of 4,000 draws is within 5 sd / sqrt(4000) of the posterior mean
    assert np.all(np.abs(draws.mean(axis=0) - np.append(reg.coef_, reg.intercept_)) < 5 * sd / np.sqrt(4000))
    mean, std = reg.predict(X[:5], return_std=True)
    np.testing.assert_allclose(mean, reg.predict(X[:5]))
    # the predictive sd is at least the noise's (0.2), and not much more with N = 4,000
    assert np.all(std > 0.19) and np.all(std < 0.25)


def test_pipeline_and_clone():
    X, y, _ = _regression(2000)
    pipe = make_pipeline(StandardScaler(), PrivateLinearRegression(x_bound=3.0, y_bound=3.0, random_state=0))
    pipe.fit(X, y / y.std())
    assert pipe.predict(X).shape == (2000,)
    twin = clone(pipe[-1])
    assert twin.get_params() == pipe[-1].get_params() and not hasattr(twin, "model_message_")


def test_mixture_finds_separated_clusters():
    from sklearn.metrics import adjusted_rand_score

    rng = np.random.default_rng(1)
    centres = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    labels = rng.integers(0, 3, 3000)
    X = centres[labels] + 0.5 * rng.normal(size=(3000, 2))
    gm = PrivateGaussianMixture(epsilon=1.0, random_state=0).fit(X)
    # clusters 4-5 sds apart: a fit at epsilon 1 with N = 3,000 should separate them almost fully
    assert adjusted_rand_score(labels, gm.labels_) > 0.9
    assert gm.predict_proba(X).sum(axis=1) == pytest.approx(1.0)
    assert gm.weights_.shape == (3,) and gm.covariances_.shape == (3, 2)
    assert gm.weights_.sum() == pytest.approx(1.0) and np.all(gm.covariances_ > 0)
    # predictions follow the learnt spreads: the known-sd model (learn_spreads=False) predicts differently
    known = gm.model_.__class__(**{**gm.model_.hyperparameters(), "learn_spreads": False})
    known.load_state({k: v for k, v in gm.model_.state().items() if k in ("eta", "prec")})
    assert not np.allclose(known.responsibilities(X[:50]), gm.predict_proba(X[:50]))


def test_lda_transform_and_message():
    rng = np.random.default_rng(0)
    topics = np.array([[0.45, 0.45, 0.05, 0.05], [0.05, 0.05, 0.45, 0.45]])
    which = rng.integers(0, 2, 1000)
    X = np.vstack([rng.multinomial(50, topics[k]) for k in which])
    lda = PrivateLDA(n_components=2, random_state=0).fit(X)
    theta = lda.transform(X)
    assert theta.shape == (1000, 2) and np.allclose(theta.sum(axis=1), 1.0)
    # the two topics are found (in either order): a document's main topic follows its source
    agree = np.mean(theta.argmax(axis=1) == which)
    assert max(agree, 1 - agree) > 0.9
    np.testing.assert_allclose(PrivateLDA.from_message(lda.model_message_).transform(X), theta)
    assert lda.get_feature_names_out().tolist() == ["privatelda0", "privatelda1"]


def test_lda_perplexity_is_scikit_learns_on_the_released_topics():
    """PrivateLDA.perplexity(X) against scikit-learn's LatentDirichletAllocation holding the same
    topics and priors: the same mean-field E-step from other starts, both stopped at a mean
    gamma change below 1e-3; the bound is stationary in gamma, so they agree to ~tol^2."""
    from sklearn.decomposition import LatentDirichletAllocation

    from stream_vips.models.lda import dirichlet_expectation

    rng = np.random.default_rng(1)
    topics = np.array([[0.45, 0.45, 0.05, 0.05], [0.05, 0.05, 0.45, 0.45]])
    X = np.vstack([rng.multinomial(30, topics[k]) for k in rng.integers(0, 2, 400)])
    lda = PrivateLDA(epsilon=2.0, n_components=2, doc_length=20, steps=5, random_state=0).fit(X[:300])
    m, lam = lda.model_, lda.model_.state()["lambda"]
    sk = LatentDirichletAllocation(n_components=2, doc_topic_prior=m.alpha, topic_word_prior=m.eta,
                                   max_doc_update_iter=m.max_iter, mean_change_tol=m.tol)
    sk.components_, sk.exp_dirichlet_component_ = lam, np.exp(dirichlet_expectation(lam))
    sk.doc_topic_prior_, sk.topic_word_prior_, sk.n_features_in_ = m.alpha, m.eta, 4
    assert lda.perplexity(X[300:]) == pytest.approx(sk.perplexity(X[300:]), rel=1e-6)


# ---------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("bad, reason", [
    (np.array([["1.5", "2"], ["0", "1"]]), "wrong_type"),
    (np.array([[np.nan, 1.0], [0.0, 1.0]]), "non_finite"),
    (np.array([[np.inf, 1.0], [0.0, 1.0]]), "non_finite"),
])
def test_bad_input_has_the_record_reason(bad, reason):
    for est in (PrivateLogisticRegression(), PrivateLinearRegression()):
        with pytest.raises(FitError, match=f"^{reason}: X "):
            est.fit(bad, [0, 1])


def test_bounds_are_public_and_reported():
    X, y, _ = _regression(500)
    with pytest.raises(FitError, match="x_bound: linreg needs a public bound > 0, got None; set x_bound="):
        PrivateLinearRegression(x_bound=None).fit(X, y)
    reg = PrivateLinearRegression(y_bound=2.5, random_state=0).fit(X, y)
    assert reg.privacy_report_["bounds"] == {"x_bound": 1.0, "y_bound": 2.5}
    assert "bound y_bound = 2.5" in reg.report()
    # how far the model moved: the same line from the fit's report and from the message alone
    moved = [line for line in reg.report().splitlines() if line.startswith("  moved: the posterior mean moved")]
    assert len(moved) == 1
    again = type(reg).from_message(reg.model_message_)
    assert moved[0] in again.report().splitlines()


def _uncentred(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Features on [0, 1/2]^4 (far from centred), a standardised linear target with R^2 about
    0.93, and a held-out split."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 0.5, (n + 2000, 4))
    y = X @ np.array([3.0, -2.0, 1.0, 4.0]) + 0.3 * rng.normal(size=n + 2000)
    y = (y - y[:n].mean()) / y[:n].std()
    return X[:n], X[n:], np.clip(y[:n], -3, 3), y[n:]


def test_feature_range_centres_on_public_midpoints_and_keeps_coefficients_in_x_units():
    """With ``feature_range`` the design is [x - m, R/2] 2/sqrt(5) with m the range's midpoint and R
    the centred rows' largest norm (0.5 here, not ``x_bound`` 1): the model is told that R, no
    design row exceeds it, the intercept absorbs the shift (coef_ x + intercept_ is the prediction)
    and the non-private fit is the conjugate posterior of the centred design (ordinary least squares
    up to the prior's pull)."""
    X, X_te, y, _ = _uncentred(4000, 0)
    reg = PrivateLinearRegression(non_private=True, feature_range=(0.0, 0.5)).fit(X, y)
    assert reg.model_message_["hyperparameters"]["x_bound"] == pytest.approx(0.5)
    Z = reg._design(np.vstack([X, [[0.0] * 4, [0.5] * 4, [9.0, -9.0, 9.0, -9.0]]]))
    assert np.linalg.norm(Z, axis=1).max() <= 0.5 + 1e-12
    np.testing.assert_allclose(reg.predict(X_te), X_te @ reg.coef_ + reg.intercept_, atol=1e-10)
    Z = reg._design(X)  # the conjugate posterior mean: ridge with the prior's alpha = 1 (lam = 1)
    w = np.linalg.solve(np.eye(5) + Z.T @ Z, Z.T @ y)
    np.testing.assert_allclose(reg.predict(X_te), reg._design(X_te) @ w, atol=1e-6)
    ols, *_ = np.linalg.lstsq(np.hstack([X, np.ones((len(X), 1))]), y, rcond=None)
    np.testing.assert_allclose(np.append(reg.coef_, reg.intercept_), ols, rtol=0.05)
    assert reg.privacy_report_["bounds"]["feature_range"] == [[0.0] * 4, [0.5] * 4]
    assert "bound x_bound = 0.5" in reg.report()
    # a smaller x_bound wins; without an intercept nothing is centred and R is the larger end's norm
    assert PrivateLinearRegression(non_private=True, feature_range=(0.0, 0.5), x_bound=0.3).fit(
        X, y).model_message_["hyperparameters"]["x_bound"] == pytest.approx(0.3)
    plain = PrivateLinearRegression(non_private=True, feature_range=(-0.25, 0.5), fit_intercept=False).fit(X, y)
    assert plain._centre() is None and plain.model_message_["hyperparameters"]["x_bound"] == pytest.approx(1.0)


def test_feature_range_clips_out_of_range_values_and_reads_back_from_the_message():
    """A value outside the public range counts as its end (the same release, seed for seed), and
    ``from_message`` with the same range predicts as the fitted estimator."""
    X, X_te, y, _ = _uncentred(2000, 1)
    wild = X.copy()
    wild[0] = [7.0, -3.0, 0.25, 0.6]
    clipped = X.copy()
    clipped[0] = [0.5, 0.0, 0.25, 0.5]
    a = PrivateLinearRegression(feature_range=(0.0, 0.5), random_state=3).fit(wild, y)
    b = PrivateLinearRegression(feature_range=(0.0, 0.5), random_state=3).fit(clipped, y)
    np.testing.assert_array_equal(a.predict(X_te), b.predict(X_te))
    again = PrivateLinearRegression.from_message(a.model_message_, feature_range=(0.0, 0.5))
    np.testing.assert_allclose(again.predict(X_te), a.predict(X_te))
    assert again.privacy_report_["bounds"]["x_bound"] == pytest.approx(0.5)


@pytest.mark.parametrize("bad", [(0.5, 0.0), (0.0, [0.5, 0.5, 0.5]), (0.0, np.inf), "0-1", (None, 1.0)])
def test_feature_range_that_is_not_a_range_is_refused_naming_the_keyword(bad):
    X, y, _ = _regression(200)
    with pytest.raises(FitError, match="^feature_range: expected"):
        PrivateLinearRegression(feature_range=bad).fit(X, y)


def test_centring_on_the_public_range_beats_the_generic_bound_on_uncentred_features():
    """The reason ``feature_range`` exists (docs/fit.md, "Centring linear regression"): on
    features far from centred the generic bound leaves the design near collinear with its
    intercept, and the released x x^T noise costs held-out error. Over 3 noise seeds at epsilon 1
    the centred fit's mean RMSE is at least 15% lower and within 10% of the non-private fit (the
    docs measured 0.277 against 0.380 without the range and 0.273 non-private)."""
    X, X_te, y, y_te = _uncentred(7600, 2)
    rmse = lambda reg: float(np.sqrt(np.mean((reg.predict(X_te) - y_te) ** 2)))  # noqa: E731
    generic = np.mean([rmse(PrivateLinearRegression(random_state=s).fit(X, y)) for s in range(3)])
    centred = np.mean([rmse(PrivateLinearRegression(feature_range=(0.0, 0.5), random_state=s).fit(X, y))
                       for s in range(3)])
    exact = rmse(PrivateLinearRegression(non_private=True, feature_range=(0.0, 0.5)).fit(X, y))
    assert centred <= 0.85 * generic and centred <= 1.1 * exact


def test_public_classes_reject_other_labels_as_records():
    X, y = _classification(1000)
    labels = np.where(y == 1, "yes", "no").astype(object)
    labels[:10] = "maybe"
    clf = PrivateLogisticRegression(classes=["no", "yes"], random_state=0).fit(X, labels)
    assert clf.privacy_report_["rejected"] == {"out_of_range": 10}
    assert set(clf.predict(X)) <= {"no", "yes"}


def test_linreg_fit_clips_y_at_three_and_says_so():
    """fit's linreg rule clips y at +-3 (RULE_Y_BOUND: a few sds of a standardised target); the
    summary prints it with its reason, and the caller's bound replaces it, saying so."""
    from stream_vips.fitting import fit, summary
    from stream_vips.models.linreg import RULE_Y_BOUND

    X, y, _ = _regression(500)
    result = fit((X, y), "linreg", seed=0)
    assert result.message["hyperparameters"]["y_bound"] == RULE_Y_BOUND == 3.0
    assert "why y_bound: y is clipped to [-3, 3]" in summary(result)
    mine = fit((X, y), "linreg", seed=0, y_bound=2.0)
    assert "why y_bound: set by the caller (y_bound = 2.0)" in summary(mine)


def test_an_estimator_warns_like_fit_in_a_regime_its_family_learns_little_in():
    from stream_vips.estimators import PrivateSigmoidBeliefNetwork
    from stream_vips.fitting import FitWarning

    Y = (np.random.default_rng(0).random((200, 10)) < 0.3).astype(float)
    with pytest.warns(FitWarning, match="sbn_figure8.json"):
        est = PrivateSigmoidBeliefNetwork(epsilon=1.0, random_state=0).fit(Y)
    assert sum(line.startswith("  warning: sbn at epsilon 1") for line in est.report().splitlines()) == 1
