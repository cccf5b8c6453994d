"""Synthetic records for demos, tests and benchmarks: linear regression, logistic regression and
LDA documents, each drawn from a known model so that a run can be scored against the truth.

* :class:`SyntheticRegressionSource` -- ``{"x": [x_1..x_d], "y": y}`` with
  ``x ~ N(0, (x_scale^2 / d) I)`` (so that ``E|x|^2 = x_scale^2``) and ``y = x . w + noise_std * e``,
  ``e ~ N(0, 1)``.
* :class:`SyntheticLogisticSource` -- ``{"x": [...], "y": 0 | 1}`` with ``||x|| <= 1`` including a
  constant bias feature and ``y ~ Bernoulli(sigmoid(w . x))``.
* :class:`SyntheticLdaSource` -- ``{"tokens": [...]}`` documents from the LDA generative process
  over K known topics on a small public vocabulary.

A fraction of the records can be replaced by malformed ones, cycling through the source's
malformed kinds (:data:`MALFORMED_KINDS`, :data:`MALFORMED_DOCUMENTS`), so a demo shows the
dead-letter path.

>>> src = SyntheticRegressionSource(count=3, dimension=2, seed=0)
>>> [len(r.value) > 0 for r in src.poll(10, 0.0)], src.exhausted
([True, True, True], True)
>>> docs = SyntheticLdaSource(count=2, n_topics=2, vocabulary_size=10, doc_length=5, seed=0)
>>> [sorted(json.loads(r.value)) for r in docs.poll(10, 0.0)]
[['tokens'], ['tokens']]
"""

from __future__ import annotations

import json
import time
from typing import Sequence

import numpy as np
from scipy.special import expit

from connectors._lines import PausableSource
from stream_vips.io import RawRecord

#: Malformed vector records: kind -> template (``%s`` is filled up to the dimension).
MALFORMED_KINDS: dict[str, str] = {
    "bad_json": '{"x": [0.1, 0.2',
    "nan": '{"x": [NaN%s], "y": 0.5}',
    "wrong_shape": '{"x": [0.1%s, 0.1], "y": 0.5}',
    "huge": '{"x": [1e400%s], "y": 0.5}',
    "wrong_type": '{"x": "not a vector", "y": 0.5}',
    "not_object": "[1, 2, 3]",
}
#: Malformed LDA documents: kind -> line (the unknown token is never in a generated vocabulary).
MALFORMED_DOCUMENTS: dict[str, str] = {
    "bad_json": '{"tokens": ["w0"',
    "empty_document": '{"tokens": ["not-a-vocabulary-word"]}',
    "wrong_type": '{"tokens": "not a list"}',
    "missing_field": '{"words": ["w0"]}',
    "out_of_range": '{"counts": {"w0": -1}}',
    "not_object": "[1, 2, 3]",
}


def _fill(template: str, dimension: int) -> str:
    return template % (", 0.1" * (dimension - 1)) if "%s" in template else template


def _vector_lines(x: np.ndarray, y: list) -> list[bytes]:
    return [b'{"x": [%s], "y": %r}' % (", ".join(map(repr, row)).encode(), yi) for row, yi in zip(x.tolist(), y)]


class _SyntheticSource(PausableSource):
    """What the generators share: count, seed, malformed injection, throttling, polling.

    Subclasses set ``_malformed`` (the malformed lines to cycle through) and implement
    ``_clean(n)``, the next ``n`` well-formed records as JSON lines.
    """

    _malformed: list[bytes]

    def __init__(self, count: int | None, seed: int, malformed_fraction: float,
                 records_per_second: float | None) -> None:
        if count is not None and int(count) < 0:
            raise ValueError(f"count must be >= 0 or null, got {count}")
        if not 0.0 <= float(malformed_fraction) <= 1.0:
            raise ValueError(f"malformed_fraction must be in [0, 1], got {malformed_fraction}")
        if records_per_second is not None and float(records_per_second) <= 0:
            raise ValueError(f"records_per_second must be > 0 or null, got {records_per_second}")
        self.count = None if count is None else int(count)
        self.malformed_fraction = float(malformed_fraction)
        self.records_per_second = None if records_per_second is None else float(records_per_second)
        self._rng = np.random.default_rng(seed)
        self._produced = 0
        self._started = time.monotonic()

    def _clean(self, n: int) -> list[bytes]:
        raise NotImplementedError

    def total(self) -> int | None:
        """``count`` (``None``: endless)."""
        return self.count

    def generate(self, n: int) -> list[bytes]:
        """The next ``n`` records as JSON lines (advances the generator)."""
        lines = self._clean(n)
        if self.malformed_fraction > 0:
            bad = np.flatnonzero(self._rng.random(n) < self.malformed_fraction)
            for j, i in enumerate(bad.tolist()):
                lines[i] = self._malformed[(self._produced + j) % len(self._malformed)]
        self._produced += n
        return lines

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self.paused or self.exhausted:
            return []
        n = max_records
        if self.count is not None:
            n = min(n, self.count - self._produced)
        if self.records_per_second is not None:
            due = int((time.monotonic() - self._started) * self.records_per_second) - self._produced
            if due <= 0:
                time.sleep(min(timeout_s, 1.0 / self.records_per_second))
                due = int((time.monotonic() - self._started) * self.records_per_second) - self._produced
            n = max(0, min(n, due))
        start = self._produced
        return [RawRecord(v, {"offset": start + i}) for i, v in enumerate(self.generate(n))]

    def commit(self) -> None:
        """A generator has nothing to commit."""

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self._produced >= self.count

    def close(self) -> None:
        """Nothing to release."""


class SyntheticRegressionSource(_SyntheticSource):
    """Generates ``count`` records (``None``: unbounded) from a fixed linear model.

    ``weights`` default to ``N(0, I)`` draws from ``seed``; ``records_per_second`` throttles
    the stream (``None``: as fast as polled).
    """

    def __init__(
        self,
        count: int | None = None,
        dimension: int = 5,
        weights: Sequence[float] | None = None,
        noise_std: float = 0.1,
        x_scale: float = 0.5,
        seed: int = 0,
        malformed_fraction: float = 0.0,
        records_per_second: float | None = None,
    ) -> None:
        if int(dimension) < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        if float(noise_std) < 0 or float(x_scale) <= 0:
            raise ValueError("noise_std must be >= 0 and x_scale > 0")
        super().__init__(count, seed, malformed_fraction, records_per_second)
        self.dimension = int(dimension)
        if weights is None:
            self.weights = self._rng.standard_normal(self.dimension)
        else:
            self.weights = np.asarray(weights, dtype=float)
            if self.weights.shape != (self.dimension,):
                raise ValueError(f"weights must have length {self.dimension}, got {self.weights.shape}")
        self.noise_std = float(noise_std)
        self.x_scale = float(x_scale)
        self._malformed = [_fill(t, self.dimension).encode() for t in MALFORMED_KINDS.values()]

    def _clean(self, n: int) -> list[bytes]:
        x = self._rng.standard_normal((n, self.dimension)) * (self.x_scale / np.sqrt(self.dimension))
        y = x @ self.weights + self.noise_std * self._rng.standard_normal(n)
        return _vector_lines(x, y.tolist())


class SyntheticLogisticSource(_SyntheticSource):
    """Generates ``count`` logistic-regression records (``None``: unbounded) from fixed weights.

    ``x = [f, bias]``: the last of the ``dimension`` features is the constant ``bias``, and the
    others are ``f ~ N(0, (x_scale^2 / (d - 1)) I)`` with ``f`` clipped to norm
    ``sqrt(1 - bias^2)``, so ``||x|| <= 1`` (the model's input bound, nothing is clipped again).
    ``y ~ Bernoulli(sigmoid(w . x))``. ``weights`` default to ``weight_scale * N(0, I)`` draws
    from ``seed``; with ``||x|| <= 1`` the logit is at most ``||w||``, so the weights must be
    large for the labels to carry signal. Malformed records are those of
    :data:`MALFORMED_KINDS` (none is a valid logistic record: y = 0.5 is not a label).
    """

    def __init__(
        self,
        count: int | None = None,
        dimension: int = 5,
        weights: Sequence[float] | None = None,
        weight_scale: float = 4.0,
        x_scale: float = 0.8,
        bias: float = 0.5,
        seed: int = 0,
        malformed_fraction: float = 0.0,
        records_per_second: float | None = None,
    ) -> None:
        if int(dimension) < 2:
            raise ValueError(f"dimension must be >= 2 (features and the bias), got {dimension}")
        if float(x_scale) <= 0 or float(weight_scale) <= 0:
            raise ValueError("x_scale and weight_scale must be > 0")
        if not 0.0 <= float(bias) < 1.0:
            raise ValueError(f"bias must be in [0, 1) so that ||x|| <= 1 leaves room for features, got {bias}")
        super().__init__(count, seed, malformed_fraction, records_per_second)
        self.dimension = int(dimension)
        if weights is None:
            self.weights = float(weight_scale) * self._rng.standard_normal(self.dimension)
        else:
            self.weights = np.asarray(weights, dtype=float)
            if self.weights.shape != (self.dimension,):
                raise ValueError(f"weights must have length {self.dimension}, got {self.weights.shape}")
        self.x_scale, self.bias = float(x_scale), float(bias)
        self._malformed = [_fill(t, self.dimension).encode() for t in MALFORMED_KINDS.values()]

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh well-formed draws as arrays ``(X, y)`` (advances the generator)."""
        d = self.dimension
        f = self._rng.standard_normal((n, d - 1)) * (self.x_scale / np.sqrt(d - 1))
        norms = np.linalg.norm(f, axis=1, keepdims=True)
        room = np.sqrt(1.0 - self.bias**2) * (1.0 - 4 * np.finfo(float).eps)  # ||x|| <= 1 after rounding
        f *= np.minimum(1.0, room / np.maximum(norms, np.finfo(float).tiny))
        X = np.hstack([f, np.full((n, 1), self.bias)])
        y = (self._rng.random(n) < expit(X @ self.weights)).astype(np.int64)
        return X, y

    def _clean(self, n: int) -> list[bytes]:
        X, y = self.sample(n)
        return _vector_lines(X, y.tolist())


class SyntheticLdaSource(_SyntheticSource):
    """Generates ``count`` documents (``None``: unbounded) from K known topics.

    The public vocabulary is ``vocabulary = ["w0", ..., "w{V-1}"]``; the topics (K x V,
    :attr:`topics`) are ``Dirichlet(topic_concentration)`` draws from ``seed`` (small
    concentrations give peaked, well separated topics). Each document draws
    ``theta ~ Dirichlet(alpha)``, a length ``1 + Poisson(doc_length - 1)`` (mean ``doc_length``),
    and for each token a topic ``z ~ theta`` and a word ``w ~ topics[z]``; all documents of a
    poll are drawn together (inverse-CDF lookups on the stacked cumulative topics).
    """

    def __init__(
        self,
        count: int | None = None,
        n_topics: int = 5,
        vocabulary_size: int = 100,
        doc_length: int = 50,
        alpha: float = 0.5,
        topic_concentration: float = 0.05,
        seed: int = 0,
        malformed_fraction: float = 0.0,
        records_per_second: float | None = None,
    ) -> None:
        for key, value in (("n_topics", n_topics), ("vocabulary_size", vocabulary_size), ("doc_length", doc_length)):
            if int(value) < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if not (float(alpha) > 0 and float(topic_concentration) > 0):
            raise ValueError("alpha and topic_concentration must be > 0")
        super().__init__(count, seed, malformed_fraction, records_per_second)
        self.n_topics, self.doc_length, self.alpha = int(n_topics), int(doc_length), float(alpha)
        V = int(vocabulary_size)
        self.vocabulary = [f"w{v}" for v in range(V)]
        self.topics = self._rng.dirichlet(np.full(V, float(topic_concentration)), self.n_topics)
        cum = np.cumsum(self.topics, axis=1)
        cum[:, -1] = 1.0
        self._stacked_cdf = (cum + np.arange(self.n_topics)[:, None]).ravel()  # row k spans (k, k + 1]
        self._words = np.asarray(self.vocabulary, dtype=object)
        self._malformed = [line.encode() for line in MALFORMED_DOCUMENTS.values()]

    def documents(self, n: int) -> list[list[str]]:
        """``n`` fresh documents as token lists (advances the generator)."""
        K, V = self.n_topics, len(self.vocabulary)
        lengths = 1 + self._rng.poisson(self.doc_length - 1, n)
        theta_cdf = np.cumsum(self._rng.dirichlet(np.full(K, self.alpha), n), axis=1)
        theta_cdf[:, -1] = 1.0
        doc = np.repeat(np.arange(n), lengths)
        z = (self._rng.random(doc.size)[:, None] >= theta_cdf[doc]).sum(axis=1)
        idx = np.searchsorted(self._stacked_cdf, z + self._rng.random(doc.size), side="right")
        w = np.minimum(idx - z * V, V - 1)  # z + u rounds to z + 1 for u within 2^-52 z of 1
        bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
        words = self._words[w].tolist()
        return [words[a:b] for a, b in zip(bounds[:-1], bounds[1:])]

    def _clean(self, n: int) -> list[bytes]:
        return [json.dumps({"tokens": doc}).encode() for doc in self.documents(n)]


#: Malformed SBN records: kind -> line (none is a valid binary image).
MALFORMED_IMAGES: dict[str, str] = {
    "bad_json": '{"y": [1, 0',
    "out_of_range": '{"y": [2, 0, 0, 0]}',
    "wrong_type": '{"y": true}',
    "missing_field": '{"x": [0, 1]}',
    "not_object": "[1, 2, 3]",
}


class SyntheticSbnSource(_SyntheticSource):
    """Generates ``count`` binary images ``{"y": [J bits]}`` from a known sigmoid belief network.

    ``n_latent`` units each switch on a disjoint block of the ``n_visible`` pixels with weight
    ``weight`` (the pattern is easy to read back); pixel biases ``visible_bias``, latent priors
    p(z_k = 1) = sigmoid(``latent_bias``). ``weights`` (J, K), ``visible_bias`` (J,) and
    ``latent_bias`` (K,) are the truth, kept as attributes for scoring.
    """

    def __init__(self, count: int | None = None, n_visible: int = 24, n_latent: int = 3, weight: float = 4.0,
                 visible_bias: float = -2.0, latent_bias: float = 0.0, seed: int = 0,
                 malformed_fraction: float = 0.0, records_per_second: float | None = None) -> None:
        if int(n_latent) < 1 or int(n_visible) < int(n_latent):
            raise ValueError(f"need 1 <= n_latent <= n_visible, got {n_latent}, {n_visible}")
        super().__init__(count, seed, malformed_fraction, records_per_second)
        self.n_visible, self.n_latent = int(n_visible), int(n_latent)
        owner = np.arange(self.n_visible) * self.n_latent // self.n_visible
        self.weights = float(weight) * (owner[:, None] == np.arange(self.n_latent)[None, :])
        self.visible_bias = np.full(self.n_visible, float(visible_bias))
        self.latent_bias = np.full(self.n_latent, float(latent_bias))
        self._malformed = [t.encode() for t in MALFORMED_IMAGES.values()]

    def sample(self, n: int) -> np.ndarray:
        """``n`` fresh images (n, J) of 0/1 (advances the generator)."""
        z = (self._rng.random((n, self.n_latent)) < expit(self.latent_bias)).astype(float)
        return (self._rng.random((n, self.n_visible)) < expit(z @ self.weights.T + self.visible_bias)).astype(np.int64)

    def _clean(self, n: int) -> list[bytes]:
        return [b'{"y": [%s]}' % ", ".join(map(str, row)).encode() for row in self.sample(n).tolist()]


class SyntheticNonlinearSource(_SyntheticSource):
    """Generates ``count`` regression records (``None``: unbounded) from a fixed smooth function.

    ``x ~ N(0, I)`` in ``dimension`` features and ``y = sin(2 x_1) + 0.5 x_2^2 - 0.5 + N(0,
    noise_std^2)`` (with one feature, the quadratic term uses x_1 too): a function a linear model
    cannot fit and a one-hidden-layer network can (the ``sep_bnn`` demo). Malformed records are
    those of :data:`MALFORMED_KINDS`.
    """

    def __init__(
        self,
        count: int | None = None,
        dimension: int = 2,
        noise_std: float = 0.1,
        seed: int = 0,
        malformed_fraction: float = 0.0,
        records_per_second: float | None = None,
    ) -> None:
        if int(dimension) < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        if float(noise_std) < 0:
            raise ValueError("noise_std must be >= 0")
        super().__init__(count, seed, malformed_fraction, records_per_second)
        self.dimension = int(dimension)
        self.noise_std = float(noise_std)
        self._malformed = [_fill(t, self.dimension).encode() for t in MALFORMED_KINDS.values()]

    def function(self, X: np.ndarray) -> np.ndarray:
        """The noise-free regression function at rows X."""
        X = np.atleast_2d(X)
        second = X[:, 1] if X.shape[1] > 1 else X[:, 0]
        return np.sin(2.0 * X[:, 0]) + 0.5 * second**2 - 0.5

    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh well-formed draws as arrays ``(X, y)`` (advances the generator)."""
        X = self._rng.standard_normal((n, self.dimension))
        return X, self.function(X) + self.noise_std * self._rng.standard_normal(n)

    def _clean(self, n: int) -> list[bytes]:
        X, y = self.sample(n)
        return _vector_lines(X, y.tolist())
