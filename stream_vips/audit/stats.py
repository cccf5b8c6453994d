"""Distinguishing tests and empirical epsilon lower bounds from release samples.

An (epsilon, delta)-DP mechanism M satisfies, for every neighbouring pair (D, D') and every
test that rejects "the data is D" on an event E of the output,

    P[M(D') in E] <= e^epsilon P[M(D) in E] + delta   and the same with D, D' swapped.

A test with false-positive rate FPR = P[M(D) in E] and false-negative rate FNR = P[M(D') not in E]
therefore forces epsilon >= log((1 - delta - FNR) / FPR) and epsilon >= log((1 - delta - FPR) / FNR).
Replacing FPR and FNR by exact (Clopper-Pearson) upper confidence bounds from independent trials
gives a lower bound on the true epsilon that holds with the stated confidence; the two bounds
are at level 1 - alpha/2 each, so both hold together with probability >= 1 - alpha.

The test is a threshold on a one-dimensional projection of the released statistic. The
projection and threshold are chosen on training trials and the bound is evaluated on separate
test trials (choosing on the trials that are also counted would bias the bound upwards).

>>> round(clopper_pearson_upper(0, 1000, 0.025), 5)
0.00368
>>> round(epsilon_lower_bound(fp=10, n_neg=10_000, fn=2_000, n_pos=10_000, delta=1e-5), 3)
6.066
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats

#: Confidence of the joint statement "both error-rate upper bounds hold".
CONFIDENCE = 0.95


def clopper_pearson_upper(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray | float:
    """Exact one-sided (1 - alpha) upper bound on a binomial rate after ``k`` successes in ``n``."""
    k_arr = np.asarray(k, dtype=float)
    with np.errstate(invalid="ignore"):
        out = np.where(k_arr >= n, 1.0, stats.beta.ppf(1.0 - alpha, k_arr + 1.0, np.maximum(n - k_arr, 1.0)))
    return float(out) if np.ndim(out) == 0 else out


def _bound_from_rates(fpr_ub: np.ndarray, fnr_ub: np.ndarray, delta: float) -> np.ndarray:
    """max(log((1 - delta - FNR)/FPR), log((1 - delta - FPR)/FNR)), -inf where both are vacuous."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr_ub, 0.0)) - np.log(fpr_ub)
        b = np.log(np.maximum(1.0 - delta - fpr_ub, 0.0)) - np.log(fnr_ub)
    out = np.fmax(a, b)
    return np.where(np.isnan(out), -np.inf, out)


def epsilon_lower_bound(fp: int, n_neg: int, fn: int, n_pos: int, delta: float,
                        confidence: float = CONFIDENCE) -> float:
    """Empirical epsilon lower bound of one threshold test (0 when the test shows nothing).

    ``fp`` of ``n_neg`` trials on side A were (wrongly) called B, ``fn`` of ``n_pos`` trials on
    side B were called A. Each rate gets a Clopper-Pearson upper bound at 1 - (1 - confidence)/2.
    """
    alpha = (1.0 - confidence) / 2.0
    eps = _bound_from_rates(np.asarray(clopper_pearson_upper(fp, n_neg, alpha)),
                            np.asarray(clopper_pearson_upper(fn, n_pos, alpha)), delta)
    return max(0.0, float(eps))


def whitened_direction(train_a: np.ndarray, train_b: np.ndarray) -> np.ndarray:
    """Projection w = (mean_B - mean_A) / pooled per-coordinate variance (diagonal LDA).

    For Gaussian noise that is independent across coordinates this is the likelihood-ratio
    direction, up to the estimation error of the training trials. Coordinates that never vary
    (no noise, no difference) get weight 0.
    """
    a, b = np.asarray(train_a, float), np.asarray(train_b, float)
    diff = b.mean(axis=0) - a.mean(axis=0)
    var = 0.5 * (a.var(axis=0) + b.var(axis=0))
    w = np.divide(diff, var, out=np.zeros_like(diff), where=var > 0)
    norm = np.linalg.norm(w)
    if not norm > 0:
        raise ValueError("training releases of the two sides do not differ: nothing to test")
    return w / norm


@dataclass(frozen=True)
class Threshold:
    """Decide B when ``projection > value``."""

    value: float
    train_epsilon: float


def choose_threshold(proj_a: np.ndarray, proj_b: np.ndarray, delta: float, n_eval: tuple[int, int] | None = None,
                     confidence: float = CONFIDENCE) -> Threshold:
    """Threshold maximising the training bound over all cut points between sorted projections.

    ``n_eval`` = (n_A, n_B) of the later test: the training error rates are turned into the
    counts they predict there, and scored with the test's Clopper-Pearson bounds (a test with
    more trials profits from a more extreme threshold). Cut points with fewer than 5 expected
    training errors on the rarer side are skipped: their rates are too noisy to extrapolate.
    """
    pa, pb = np.sort(np.asarray(proj_a, float)), np.sort(np.asarray(proj_b, float))
    cuts = np.unique(np.concatenate([pa, pb]))
    cuts = np.concatenate([[cuts[0] - 1.0], 0.5 * (cuts[1:] + cuts[:-1]) if cuts.size > 1 else cuts, [cuts[-1] + 1.0]])
    na, nb = pa.size, pb.size
    fp = na - np.searchsorted(pa, cuts, side="right")  # A above the cut: called B
    fn = np.searchsorted(pb, cuts, side="right")  # B at or below: called A
    ma, mb = n_eval if n_eval is not None else (na, nb)
    alpha = (1.0 - confidence) / 2.0
    fp_pred, fn_pred = np.round(fp / na * ma), np.round(fn / nb * mb)
    eps = _bound_from_rates(clopper_pearson_upper(fp_pred, ma, alpha), clopper_pearson_upper(fn_pred, mb, alpha), delta)
    eps = np.where((np.minimum(fp, fn) >= 5), eps, -np.inf)
    if not np.any(np.isfinite(eps)):
        eps = _bound_from_rates(clopper_pearson_upper(fp, na, alpha), clopper_pearson_upper(fn, nb, alpha), delta)
    i = int(np.argmax(eps))
    return Threshold(float(cuts[i]), float(eps[i]))


def ideal_lower_bound(sensitivity: float, n: int, delta: float, q: float = 1.0,
                      confidence: float = CONFIDENCE) -> float:
    """The bound a perfect threshold test reaches on ``n`` trials per side of a Gaussian release.

    Sides (1 - q) N(0, 1) + q N(-s/2, 1) and (1 - q) N(0, 1) + q N(+s/2, 1) in the whitened
    projection (s = ``sensitivity`` in noise units; q = 1 is the plain Gaussian shift), with
    error counts at their expectations: what a correct family's audit should come close to.

    >>> round(ideal_lower_bound(1.0, 20_000, 1e-3), 2)
    2.33
    """
    t = np.linspace(-6.0 - sensitivity, 6.0 + sensitivity, 4001)
    lo, hi = -0.5 * sensitivity, 0.5 * sensitivity
    fpr = (1.0 - q) * stats.norm.sf(t) + q * stats.norm.sf(t - lo)
    fnr = (1.0 - q) * stats.norm.cdf(t) + q * stats.norm.cdf(t - hi)
    alpha = (1.0 - confidence) / 2.0
    eps = _bound_from_rates(clopper_pearson_upper(np.round(fpr * n), n, alpha),
                            clopper_pearson_upper(np.round(fnr * n), n, alpha), delta)
    return max(0.0, float(np.max(eps)))


@dataclass(frozen=True)
class AuditResult:
    """One audit: claimed epsilon at ``delta``, the empirical lower bound and its ingredients."""

    claimed_epsilon: float
    delta: float
    epsilon_lower_bound: float
    n_train: int
    n_test: int
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    threshold: float
    train_epsilon: float
    confidence: float

    @property
    def tightness(self) -> float:
        """Lower bound / claim: near 1 is a tight audit, above 1 a privacy violation."""
        return self.epsilon_lower_bound / self.claimed_epsilon if self.claimed_epsilon > 0 else math.inf

    @property
    def violated(self) -> bool:
        """The releases are provably (at ``confidence``) less private than claimed."""
        return self.epsilon_lower_bound > self.claimed_epsilon

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tightness": self.tightness, "violated": self.violated}


def audit_samples(train_a: np.ndarray, train_b: np.ndarray, test_a: np.ndarray, test_b: np.ndarray,
                  delta: float, claimed_epsilon: float, confidence: float = CONFIDENCE) -> AuditResult:
    """Projection and threshold from the training releases, bound from the test releases.

    Each argument is an (n, k) array of flattened releases from side A or B of one neighbouring pair.
    """
    w = whitened_direction(train_a, train_b)
    thr = choose_threshold(np.asarray(train_a) @ w, np.asarray(train_b) @ w, delta,
                           n_eval=(len(test_a), len(test_b)), confidence=confidence)
    fp = int(np.count_nonzero(np.asarray(test_a) @ w > thr.value))
    fn = int(np.count_nonzero(np.asarray(test_b) @ w <= thr.value))
    alpha = (1.0 - confidence) / 2.0
    return AuditResult(
        claimed_epsilon=float(claimed_epsilon), delta=float(delta),
        epsilon_lower_bound=epsilon_lower_bound(fp, len(test_a), fn, len(test_b), delta, confidence),
        n_train=int(min(len(train_a), len(train_b))), n_test=int(min(len(test_a), len(test_b))),
        false_positives=fp, false_negatives=fn,
        fpr_upper=float(clopper_pearson_upper(fp, len(test_a), alpha)),
        fnr_upper=float(clopper_pearson_upper(fn, len(test_b), alpha)),
        threshold=thr.value, train_epsilon=thr.train_epsilon, confidence=float(confidence),
    )
