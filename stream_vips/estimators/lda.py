"""Private latent Dirichlet allocation (the ``lda`` family) as a scikit-learn transformer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from sklearn.base import ClassNamePrefixFeaturesOutMixin, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from stream_vips.errors import FitError
from stream_vips.estimators._base import PrivateEstimator


class PrivateLDA(ClassNamePrefixFeaturesOutMixin, TransformerMixin, PrivateEstimator):
    """Latent Dirichlet allocation with (epsilon, delta)-differential privacy (VIPS): K topics
    over a public vocabulary, learnt from a document-word count matrix; ``transform`` gives each
    document's topic proportions (the posterior mean of theta under the released topics);
    ``perplexity`` the held-out perplexity as scikit-learn's ``LatentDirichletAllocation`` reports it.

    - ``epsilon``, ``delta``: the budget one ``fit`` spends (cross-validation spends it per fit);
    - ``n_components``: K, the topics (default 10, the family's);
    - ``vocabulary``: the V words naming X's columns (``None``: ``w0`` ... ``w{V-1}``); public,
      like the column count;
    - ``doc_length``, ``clip_fraction``: every document is resampled to ``doc_length`` words and
      its contribution clipped to L2 norm ``clip_fraction * doc_length`` (``None``: the fit
      rule's 100 and 0.1);
    - ``steps``, ``non_private``, ``random_state``: as in
      :class:`~stream_vips.estimators.PrivateLogisticRegression`.

    X holds non-negative word counts; fractional entries are rounded to whole counts. A document
    with no word is rejected by the family (``empty_document``) and still counts in N.

    >>> import numpy as np
    >>> from stream_vips.estimators import PrivateLDA
    >>> rng = np.random.default_rng(0)
    >>> topics = np.array([[0.45, 0.45, 0.05, 0.05], [0.05, 0.05, 0.45, 0.45]])
    >>> X = np.vstack([rng.multinomial(50, topics[k]) for k in rng.integers(0, 2, 1000)])
    >>> lda = PrivateLDA(epsilon=1.0, n_components=2, random_state=0)
    >>> theta = lda.fit_transform(X)
    >>> theta.shape, bool(np.allclose(theta.sum(axis=1), 1.0))
    ((1000, 2), True)
    """

    family: ClassVar[str] = "lda"
    bound_params: ClassVar[tuple[str, ...]] = ("doc_length", "clip_fraction")

    def __init__(self, *, epsilon: float = 1.0, delta: float = 1e-5, n_components: int = 10,
                 vocabulary: Sequence[str] | None = None, doc_length: int | None = None,
                 clip_fraction: float | None = None, steps: int | None = None, non_private: bool = False,
                 random_state: Any = None) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.n_components = n_components
        self.vocabulary = vocabulary
        self.doc_length = doc_length
        self.clip_fraction = clip_fraction
        self.steps = steps
        self.non_private = non_private
        self.random_state = random_state

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.positive_only = True
        return tags

    def _words(self, n_features: int) -> list[str]:
        if self.vocabulary is None:
            return [f"w{j}" for j in range(n_features)]
        words = [str(w) for w in self.vocabulary]
        if len(words) != n_features or len(set(words)) != len(words):
            raise FitError(f"vocabulary: expected {n_features} distinct words (one per column of X), got "
                           f"{len(words)} ({len(set(words))} distinct)")
        return words

    def _model_params(self, n_features: int) -> dict[str, Any]:
        params: dict[str, Any] = {"vocabulary": self._words(n_features), "n_topics": int(self.n_components)}
        return {**params, **{k: v for k, v in (("doc_length", self.doc_length), ("clip_fraction", self.clip_fraction))
                             if v is not None}}

    def _counts(self, X: Any, reset: bool) -> np.ndarray:
        X = self._validate(X, reset=reset)
        if (X < 0).any():
            raise FitError(f"out_of_range: Negative values in data passed to {type(self).__name__} (X holds word "
                           "counts, which are >= 0)")
        return np.rint(X).astype(np.int64)

    def _data(self, X: np.ndarray, y: np.ndarray | None) -> Any:
        words = np.asarray(self._words(X.shape[1]), dtype=object)
        return [{"counts": dict(zip(words[row > 0].tolist(), row[row > 0].tolist()))} for row in X]

    def fit(self, X: Any, y: Any = None) -> PrivateLDA:
        """Fit privately to the documents (rows of counts) of X, spending the whole budget once."""
        counts = self._counts(X, reset=True)
        self._fit_private(counts, None)
        self._n_features_out = int(self.n_components)
        return self

    def _from_message(self, message: Any) -> None:
        hyper = message["hyperparameters"]
        self.n_features_in_ = len(hyper["vocabulary"])
        self.n_components = int(hyper["n_topics"])
        self._n_features_out = self.n_components

    @property
    def components_(self) -> np.ndarray:
        """The topics' word distributions E[beta], shape (K, V)."""
        return np.asarray(self.model_.topics(), dtype=float)

    def transform(self, X: Any) -> np.ndarray:
        """Each document's topic proportions E[theta | document] under the released topics, shape
        (n, K); a document with no word gets the prior's, 1/K each."""
        import scipy.sparse as sp

        from stream_vips.models.lda import Bags, e_step

        check_is_fitted(self, "posterior_")
        counts = sp.csr_matrix(self._counts(X, reset=False).astype(np.float64))
        counts.eliminate_zeros()
        m = self.model_
        out = np.full((counts.shape[0], m.n_topics), 1.0 / m.n_topics)
        rows = np.flatnonzero(np.diff(counts.indptr) > 0)
        if len(rows):
            sub = counts[rows]
            bags = Bags(sub.indices.astype(np.int64), sub.data, sub.indptr.astype(np.int64))
            for blk in e_step(bags, m._exp_elog_beta_t, m.alpha, m.max_iter, m.tol, m.block_size):
                out[rows[blk.docs]] = blk.gamma / blk.gamma.sum(axis=1, keepdims=True)
        return out

    def perplexity(self, X: Any) -> float:
        """Held-out perplexity of the documents (rows of counts) of X under the released topics:
        scikit-learn's ``LatentDirichletAllocation.perplexity(X)`` on the same topics, exp(-ELBO
        per word) with theta inferred per document (:meth:`stream_vips.models.lda.LDA.held_out_perplexity`).
        Post-processing of the release: it spends nothing."""
        check_is_fitted(self, "posterior_")
        counts = self._counts(X, reset=False)
        return float(self.model_.held_out_perplexity(self._data(counts, None)))

    def sample_posterior(self, n: int, random_state: Any = None) -> np.ndarray:
        """``n`` draws of the topics from their Dirichlet posteriors, shape (n, K, V)."""
        rng = check_random_state(random_state)
        lam = np.asarray(self.model_.state()["lambda"], dtype=float)
        g = rng.gamma(np.broadcast_to(lam, (int(n), *lam.shape)))  # Dirichlet draws as normalised Gammas
        return g / g.sum(axis=-1, keepdims=True)
