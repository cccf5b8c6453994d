"""VIPS latent Dirichlet allocation (VIPS JAIR 2020, section 4, Algorithm 3).

A record is one document, ``{"tokens": ["word", ...]}`` or ``{"counts": {"word": n, ...}}``.
The vocabulary is public configuration (a list of words or a file with one word per line); it is
never learned from the stream. Tokens outside it are dropped, and a document with no known token
is rejected (``empty_document``). Every accepted document is resampled to the public length N by
drawing N of its words with replacement (the paper's fixed-length preprocessing), so one
document's expected counts always sum to N. The reservoir row is the document's N word ids.

Behind the privacy wall, :meth:`LDA.clipped_sum` runs the Hoffman et al. (2010) fixed-point
iterations for each document's gamma and phi, vectorized over blocks of documents sorted by
their number of distinct words (documents are sparse unique-word counts; no K x V array per
document is ever formed), takes the L2 norm of each document's expected counts
``c_dv * phi_dvk`` (a K x V matrix with as many non-zero columns as the document has distinct
words) from that sparse form, clips each to ``a * N`` and sums them with one sparse product.
:meth:`LDA.update` is the M-step on the privatized mean: negatives to 0,
``lambda_hat = eta + D * s`` with D the configured corpus size (``dataset_size``), blended with
rho_t.

Read side: :meth:`LDA.held_out_perplexity` and :meth:`LDA.per_word_bound` (the held-out
per-word bound as scikit-learn's ``perplexity`` and gensim's ``log_perplexity`` report it),
:meth:`LDA.perplexity` (the paper's eq. 32, without the topics' term),
:meth:`LDA.top_words`, and :func:`topic_recovery` for synthetic corpora with known topics.

Length: over the project's 600-line guide because a family is one module: besides the model
it holds everything the package knows about the family (its fit rule, synthetic data, demo and
audit pair: the hooks of :class:`~stream_vips.models.base.Model`).

>>> model = LDA(vocabulary=["apple", "pear", "goal", "match"], n_topics=2, doc_length=8,
...             dataset_size=100, seed=0)
>>> parsed = model.parse_batch([{"tokens": ["apple", "pear", "apple"]}, {"counts": {"goal": 2}},
...                             {"tokens": ["unknown"]}, [1, 2]])
>>> parsed.rows["words"].shape, parsed.accepted.tolist()
((2, 8), [0, 1])
>>> [(i, reason) for i, reason, _ in parsed.rejected]
[(2, 'empty_document'), (3, 'not_object')]
>>> s = model.clipped_sum(parsed.rows)["s"]
>>> s.shape, bool(np.all(s >= 0)), round(float(model.blocks()[0].bound), 3)
((2, 4), True, 0.8)
>>> model.update({"s": s / 2}, rho=0.5)
>>> len(model.top_words(2)[0])
2
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linear_sum_assignment
from scipy.special import gammaln, psi

from stream_vips.models import summaries
from stream_vips.models._validate import integer
from stream_vips.models.base import Block, Model, ParsedBatch
from stream_vips.models.fit_rule import Settings, accountant_for, why_accountant
from stream_vips.models.synthetic import Demo, SyntheticData
from stream_vips.privacy.mechanisms import clip_factors
from stream_vips.records import EMPTY_DOCUMENT, MISSING_FIELD, NOT_OBJECT, OUT_OF_RANGE, WRONG_TYPE

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit

#: Guards 0/0 in phi's normaliser, as in Hoffman et al.'s reference code.
_EPS = 1e-100
#: Largest accepted count in a ``{"counts": ...}`` record (keeps int64 cumulative sums exact).
MAX_COUNT = 2**31 - 1


@dataclass(frozen=True)
class Bags:
    """Documents as sparse unique-word counts (CSR): document d owns entries indptr[d]:indptr[d+1]."""

    ids: np.ndarray  # int64 word ids, unique within a document
    counts: np.ndarray  # float64 counts (> 0)
    indptr: np.ndarray  # int64, length n_docs + 1

    @property
    def n_docs(self) -> int:
        return len(self.indptr) - 1

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> Bags:
        """Unique ids and counts of each row of an (n, N) array of word ids."""
        rows = np.sort(np.asarray(rows), axis=1)
        n, N = rows.shape
        new = np.ones((n, N), dtype=bool)
        new[:, 1:] = rows[:, 1:] != rows[:, :-1]
        starts = np.flatnonzero(new.ravel())
        counts = np.diff(np.append(starts, n * N)).astype(np.float64)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(new.sum(axis=1), out=indptr[1:])
        return cls(rows.ravel()[starts].astype(np.int64), counts, indptr)


@dataclass(frozen=True)
class EStepBlock:
    """Converged variational parameters for one block of documents (padded to L distinct words).

    ``phi`` for word slot l of document b is ``exp_elog_theta[b] * exp(E[log beta])[:, ids[b, l]]
    / phinorm[b, l]``; padded slots have ``counts == 0``. ``sq_norms[b]`` is the squared L2 norm
    of document b's expected word-topic counts ``c_bl * phi_blk`` (its K x V contribution).
    """

    docs: np.ndarray  # (nb,) indices into the Bags
    ids: np.ndarray  # (nb, L) word ids
    counts: np.ndarray  # (nb, L)
    gamma: np.ndarray  # (nb, K)
    exp_elog_theta: np.ndarray  # (nb, K)
    phinorm: np.ndarray  # (nb, L)
    iterations: np.ndarray  # (nb,) fixed-point iterations run per document
    sq_norms: np.ndarray  # (nb,)


#: Fit-rule constants (:meth:`LDA.fit_rule`), the settings benchmarks/lda_eval.py ran its corpora with.
RULE_BATCH = 500
RULE_MIN_Q = 0.02
RULE_STEPS = 30
RULE_KAPPA = 0.55
RULE_DOC_LENGTH = 100
RULE_CLIP_FRACTION = 0.1
#: Passes over the corpus of a non-private fit.
RULE_NON_PRIVATE_PASSES = 3
#: The regime benchmarks/results/lda_eval.json measured as learning little (:meth:`LDA.regime_warning`):
#: its news corpus, D = 2,677 documents over V = 1,000 words, at epsilon up to 4.
WEAK_DOCS_PER_WORD = 2_677 / 1_000
WEAK_EPSILON = 4.0

def dirichlet_expectation(x: np.ndarray) -> np.ndarray:
    """E[log theta] under Dirichlet(x), along the last axis."""
    return psi(x) - psi(x.sum(axis=-1, keepdims=True))


def _theta_phinorm(gamma: np.ndarray, beta: np.ndarray, theta: np.ndarray, phinorm: np.ndarray,
                   row_buf: np.ndarray, fresh: np.ndarray, alpha: float, psi_alpha: float) -> None:
    """In place: theta = exp(E[log theta]) of the rows of gamma (n x K), and phinorm (n x L) =
    theta . beta_l + eps for the gathered beta (n x L x K).

    Most of a converging document's topics end with gamma_k == alpha exactly (their expected
    count is below half an ulp of alpha), so once at least half of the entries are alpha,
    digamma is evaluated only on the others (``fresh`` is an n x K bool buffer) and psi(alpha)
    is copied: bit-for-bit the same theta at a fraction of the cost. Row sums are BLAS products.
    """
    np.matmul(gamma, np.ones(gamma.shape[1]), out=row_buf)
    psi(row_buf, out=row_buf)
    np.not_equal(gamma, alpha, out=fresh)
    if 2 * np.count_nonzero(fresh) < fresh.size:
        theta.fill(psi_alpha)
        theta[fresh] = psi(gamma[fresh])
    else:
        psi(gamma, out=theta)
    np.subtract(theta, row_buf[:, None], out=theta)
    np.exp(theta, out=theta)
    np.matmul(beta, theta[:, :, None], out=phinorm[:, :, None])
    np.add(phinorm, _EPS, out=phinorm)


def e_step(
    bags: Bags,
    exp_elog_beta_t: np.ndarray,
    alpha: float,
    max_iter: int,
    tol: float,
    block_size: int = 128,
    cache_bytes: int = 4 << 20,
) -> Iterator[EStepBlock]:
    """Hoffman-style fixed-point iterations for gamma and phi, one block of documents at a time.

    ``exp_elog_beta_t`` is exp(E[log beta]) transposed, V x K. Each document starts from
    gamma = alpha + N_d / K and iterates
    gamma <- alpha + exp(E[log theta]) * sum_l (c_l / phinorm_l) beta_l, phinorm_l = exp(E[log theta]) . beta_l
    until the mean absolute change of gamma falls below ``tol`` or ``max_iter`` iterations ran
    (gensim's and scikit-learn's rule, checked for every document after every iteration).
    Documents are processed in blocks sorted by their number of distinct words, so padding is
    small; a block holds at most ``block_size`` documents and its gathered (block, L, K) rows of
    beta at most ``cache_bytes``, so they stay in cache across iterations. One iteration of a
    block is a fixed number of numpy calls on preallocated arrays (both products are one BLAS
    matrix-vector call per document, looped in C); converged documents leave the working set,
    which is compacted once a quarter of it has converged (compacting costs about an iteration).
    """
    K = exp_elog_beta_t.shape[1]
    lengths = np.diff(bags.indptr)
    order = np.argsort(lengths, kind="stable")
    start = 0
    workspace = np.empty(0)  # reused for every block's gathered beta (no fresh pages per block)
    psi_alpha = float(psi(np.float64(alpha)))
    beta_sq = np.square(exp_elog_beta_t)
    while start < len(order):
        L = int(lengths[order[min(start + block_size, len(order)) - 1]])
        nb = max(1, min(block_size, cache_bytes // (K * L * exp_elog_beta_t.itemsize)))
        docs = order[start : start + nb]
        start += nb
        nb, L = len(docs), int(lengths[docs[-1]])
        slot = np.arange(L)
        mask = slot[None, :] < lengths[docs][:, None]
        pos = np.where(mask, bags.indptr[docs][:, None] + slot[None, :], 0)
        ids = np.where(mask, bags.ids[pos], 0)
        counts = np.where(mask, bags.counts[pos], 0.0)
        if workspace.size < nb * L * K:
            workspace = np.empty(nb * L * K)
        beta = workspace[: nb * L * K].reshape(nb, L, K)
        np.take(exp_elog_beta_t, ids, axis=0, out=beta, mode="clip")  # ids are in range: Bags hold word ids
        gamma = np.empty((nb, K))
        gamma[:] = alpha + counts.sum(axis=1, keepdims=True) / K
        theta, phinorm = np.empty((nb, K)), np.empty((nb, L))
        iterations = np.full(nb, max_iter, dtype=np.int64)
        # Working set: rows ws of the block still iterated; a converged row keeps iterating until
        # the set is compacted (once a quarter of it has converged: compacting costs about an
        # iteration), with tolerance -inf so that it is stored only once.
        ws, tol_w, n_live = np.arange(nb), np.full(nb, float(tol)), nb
        b_w, c_w, g_w = beta, counts, gamma.copy()
        t_w, p_w, new, r_w = np.empty((nb, K)), np.empty((nb, L)), np.empty((nb, K)), np.empty((nb, L))
        row_buf, change, done = np.empty(nb), np.empty(nb), np.empty(nb, dtype=bool)
        fresh, means = np.empty((nb, K), dtype=bool), np.full(K, 1.0 / K)  # means as a BLAS product
        _theta_phinorm(g_w, b_w, t_w, p_w, row_buf, fresh, alpha, psi_alpha)
        for it in range(max_iter):
            np.divide(c_w, p_w, out=r_w)
            np.matmul(r_w[:, None, :], b_w, out=new[:, None, :])
            new *= t_w
            new += alpha
            np.subtract(new, g_w, out=g_w)  # g_w is free once its change is taken
            np.abs(g_w, out=g_w)
            np.matmul(g_w, means, out=change)
            g_w, new = new, g_w
            _theta_phinorm(g_w, b_w, t_w, p_w, row_buf, fresh, alpha, psi_alpha)
            np.less(change, tol_w, out=done)
            if not done.any():
                continue
            idx = ws[done]
            gamma[idx], theta[idx], phinorm[idx] = g_w[done], t_w[done], p_w[done]
            iterations[idx] = it + 1
            tol_w[done] = -np.inf
            n_live -= len(idx)
            if not n_live:
                break
            if n_live <= 0.75 * len(ws):
                live = tol_w > -np.inf
                ws, b_w, c_w, g_w, t_w, p_w = ws[live], b_w[live], c_w[live], g_w[live], t_w[live], p_w[live]
                new, r_w = np.empty_like(g_w), np.empty_like(p_w)
                row_buf, change, done = np.empty(n_live), np.empty(n_live), np.empty(n_live, dtype=bool)
                fresh = np.empty((n_live, K), dtype=bool)
                tol_w = np.full(n_live, float(tol))
        else:
            live = tol_w > -np.inf
            idx = ws[live]
            gamma[idx], theta[idx], phinorm[idx] = g_w[live], t_w[live], p_w[live]
        # sum_lk (c_l phi_lk)^2 = sum_l (c_l / phinorm_l)^2 (theta^2 . beta_l^2), with beta^2 gathered
        np.take(beta_sq, ids, axis=0, out=beta, mode="clip")
        sq_norms = np.einsum("bl,bl->b", np.square(counts / phinorm), (beta @ np.square(theta)[:, :, None])[:, :, 0])
        yield EStepBlock(docs, ids, counts, gamma, theta, phinorm, iterations, sq_norms)


def hellinger(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Hellinger distances between the rows of ``p`` (m x V) and ``q`` (n x V): an m x n matrix."""
    sp_, sq = np.sqrt(p), np.sqrt(q)
    sq_dist = (sp_**2).sum(1)[:, None] + (sq**2).sum(1)[None, :] - 2.0 * sp_ @ sq.T
    return np.sqrt(np.maximum(sq_dist, 0.0) / 2.0)


def topic_recovery(true_topics: np.ndarray, topics: np.ndarray) -> float:
    """Mean Hellinger distance between known and estimated topics after Hungarian matching.

    Both arguments are K x V row-stochastic matrices; topics are matched one to one by
    minimising the total Hellinger distance (``scipy.optimize.linear_sum_assignment``). 0 is
    perfect recovery, 1 is disjoint supports.
    """
    true_topics, topics = np.asarray(true_topics, float), np.asarray(topics, float)
    if true_topics.shape != topics.shape:
        raise ValueError(f"topic matrices differ in shape: {true_topics.shape} vs {topics.shape}")
    cost = hellinger(true_topics, topics)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def load_vocabulary(vocabulary: Sequence[str] | str | Path) -> list[str]:
    """The vocabulary as a list: given directly, or read from a UTF-8 file with one word per line."""
    if isinstance(vocabulary, (str, Path)):
        path = Path(vocabulary)
        try:
            words = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        except OSError as exc:
            raise ValueError(f"vocabulary: cannot read {str(path)!r}: {exc}") from None
        words = [w for w in words if w]
    else:
        words = list(vocabulary)
    if not words:
        raise ValueError("vocabulary: must contain at least one word")
    if not all(isinstance(w, str) and w for w in words):
        raise ValueError("vocabulary: every entry must be a non-empty string")
    if len(set(words)) != len(words):
        dup = next(w for i, w in enumerate(words) if w in words[:i])
        raise ValueError(f"vocabulary: duplicate word {dup!r}")
    return words


#: Malformed documents: kind -> line (the unknown token is never in a generated vocabulary).
MALFORMED_DOCUMENTS: dict[str, str] = {
    "bad_json": '{"tokens": ["w0"',
    "empty_document": '{"tokens": ["not-a-vocabulary-word"]}',
    "wrong_type": '{"tokens": "not a list"}',
    "missing_field": '{"words": ["w0"]}',
    "out_of_range": '{"counts": {"w0": -1}}',
    "not_object": "[1, 2, 3]",
}


class DocumentData(SyntheticData):
    """Documents ``{"tokens": [...]}`` from K known topics.

    The public vocabulary is ``vocabulary = ["w0", ..., "w{V-1}"]``; the topics (K x V,
    :attr:`topics`) are ``Dirichlet(topic_concentration)`` draws (small concentrations give
    peaked, well separated topics). Each document draws ``theta ~ Dirichlet(alpha)``, a length
    ``1 + Poisson(doc_length - 1)`` (mean ``doc_length``), and for each token a topic ``z ~ theta``
    and a word ``w ~ topics[z]``; all documents of a call are drawn together (inverse-CDF lookups
    on the stacked cumulative topics).
    """

    def __init__(self, rng: np.random.Generator, n_topics: int = 5, vocabulary_size: int = 100,
                 doc_length: int = 50, alpha: float = 0.5, topic_concentration: float = 0.05) -> None:
        for key, value in (("n_topics", n_topics), ("vocabulary_size", vocabulary_size), ("doc_length", doc_length)):
            if int(value) < 1:
                raise ValueError(f"{key} must be >= 1, got {value}")
        if not (float(alpha) > 0 and float(topic_concentration) > 0):
            raise ValueError("alpha and topic_concentration must be > 0")
        super().__init__(rng)
        self.n_topics, self.doc_length, self.alpha = int(n_topics), int(doc_length), float(alpha)
        V = int(vocabulary_size)
        self.vocabulary = [f"w{v}" for v in range(V)]
        self.topics = rng.dirichlet(np.full(V, float(topic_concentration)), self.n_topics)
        cum = np.cumsum(self.topics, axis=1)
        cum[:, -1] = 1.0
        self._stacked_cdf = (cum + np.arange(self.n_topics)[:, None]).ravel()  # row k spans (k, k + 1]
        self._words = np.asarray(self.vocabulary, dtype=object)
        self.malformed = tuple(line.encode() for line in MALFORMED_DOCUMENTS.values())

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

    def records(self, n: int) -> list[bytes]:
        return [json.dumps({"tokens": doc}).encode() for doc in self.documents(n)]

    @property
    def model_params(self) -> dict[str, Any]:
        return {"vocabulary": list(self.vocabulary)}


def _demo_lines(s: Mapping[str, Any]) -> list[str]:
    return [f"held-out perplexity  {s['perplexity']:.2f} (private), {s['non_private_perplexity']:.2f} "
            f"(non-private, same records, {s['non_private_updates']} updates); "
            f"uniform words: {s['vocabulary_size']}",
            f"topic recovery       mean Hellinger {s['topic_recovery']:.4f} (private), "
            f"{s['non_private_topic_recovery']:.4f} (non-private); 0 is exact, 1 disjoint"]


class LDA(Model):
    """Latent Dirichlet allocation by VIPS: K topics over a public vocabulary of V words, learnt by
    stochastic variational inference whose E-step runs behind the privacy wall on documents
    resampled to a public length and whose released statistic is the clipped sum of the documents'
    expected word-topic counts. Held-out fit is :meth:`held_out_perplexity`, the number
    scikit-learn's ``LatentDirichletAllocation.perplexity`` and gensim's ``log_perplexity`` report:
    exp(-ELBO per word) of the held-out documents, theta inferred on them by the E-step (``max_iter``,
    ``tol``) with the topics fixed at their posterior, the topics' KL term included (lower is
    better); :meth:`perplexity` (paper eq. 32) leaves that term out.

    Parameters (public configuration, privacy rule 5 in docs/privacy.md):

    - ``vocabulary``: the V words (a list, or a path to a UTF-8 file with one word per line); its
      size is the family's dimension d;
    - ``dataset_size``: D, the M-step's corpus size (the reservoir capacity; fit's N);
    - ``n_topics``: K;
    - ``doc_length``: N, every document is resampled to N words;
    - ``alpha``, ``eta``: the symmetric Dirichlet priors on theta and beta (``alpha`` None: 1/K);
    - ``clip_fraction``: a, each document's contribution is clipped to L2 norm a * N (1: no
      clipping, as in the paper);
    - ``max_iter``, ``tol``: the E-step's iteration cap and mean-absolute-change tolerance (also
      of the held-out evaluation);
    - ``block_size``: documents per vectorized E-step block;
    - ``seed``: the initial lambda and the resampling draws (public randomness: no record enters
      them); None (the default): in a seeded run (``privacy.seed``, a learner's or ``fit``'s
      ``seed=``, an estimator's ``random_state``) a seed derived from the run's
      (:func:`stream_vips.core.build.model_seed`, never published), so the run is reproduced
      exactly; in an unseeded run OS entropy.

    Sensitivity. A document's contribution is the K x V matrix u_kv = sum_n phi_nk [w_n = v].
    Its entries are >= 0 and sum to N, so ||u||_2 <= N (paper eq. 28); clipping scales u by
    min(1, aN / ||u||) > 0, so the clipped contribution is still entrywise >= 0 with
    ||u||_2 <= C = aN. That C is the block's bound. Under replace-one adjacency the batch sum
    moves by u - v for two such clipped contributions, and because u, v >= 0 entrywise,
    ||u - v||^2 = ||u||^2 + ||v||^2 - 2 u.v <= ||u||^2 + ||v||^2 <= 2 C^2: the replace-one
    diameter is sqrt(2) C, not 2 C (see :meth:`diameter`). The engine divides the noisy sum by
    the public normaliser, so the noisy mean estimates the paper's s-bar = (1/S) sum_d u_d.
    """

    family: ClassVar[str] = "lda"
    record_format: ClassVar[str] = ('{"tokens": ["word", ...]} or {"counts": {"word": n, ...}} (words outside the '
                                    'vocabulary are dropped)')
    record_field: ClassVar[str] = "tokens"
    dim_param: ClassVar[str] = "vocabulary"
    dimension_of: ClassVar[Callable[[Any], int]] = staticmethod(lambda vocabulary: len(load_vocabulary(vocabulary)))
    synthetic: ClassVar[type[SyntheticData]] = DocumentData
    demo: ClassVar[Demo[LDA, DocumentData]] = Demo(
        about="LDA (K = 4 known topics over a 60-word vocabulary, documents resampled to 40 words): held-out "
              "perplexity bound and topic recovery (mean Hellinger distance)",
        records=70_000, reservoir=20_000, batch_size=4_000, every_records=2_000, kappa=0.55,
        source={"n_topics": 4, "vocabulary_size": 60, "doc_length": 40, "alpha": 0.2},
        params=lambda data, seed: {"vocabulary": data.vocabulary, "n_topics": data.n_topics,
                                   "doc_length": data.doc_length, "alpha": data.alpha, "seed": seed},
        held_out=lambda data: [{"tokens": doc} for doc in data.documents(500)],
        score=lambda model, data, docs: {"perplexity": model.perplexity(docs),
                                         "topic_recovery": topic_recovery(data.topics, model.topics())},
        reference=lambda data, _: {"vocabulary_size": len(data.vocabulary)},
        lines=_demo_lines)

    def __init__(
        self,
        vocabulary: list[str] | str,
        dataset_size: int,
        n_topics: int = 10,
        doc_length: int = 500,
        alpha: float | None = None,
        eta: float = 0.01,
        clip_fraction: float = 0.1,
        max_iter: int = 50,
        tol: float = 1e-3,
        block_size: int = 128,
        seed: int | None = None,
    ) -> None:
        self.vocabulary = load_vocabulary(vocabulary)
        self._index = {w: i for i, w in enumerate(self.vocabulary)}
        for key, value, lo in (("n_topics", n_topics, 1), ("doc_length", doc_length, 1),
                               ("dataset_size", dataset_size, 1), ("max_iter", max_iter, 1),
                               ("block_size", block_size, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
                raise ValueError(f"{key}: must be an integer >= {lo}, got {value!r}")
        self.n_topics, self.doc_length, self.dataset_size = int(n_topics), int(doc_length), int(dataset_size)
        self.max_iter, self.block_size = int(max_iter), int(block_size)
        self.alpha = 1.0 / self.n_topics if alpha is None else float(alpha)
        self.eta, self.clip_fraction, self.tol = float(eta), float(clip_fraction), float(tol)
        for key, number in (("alpha", self.alpha), ("eta", self.eta), ("tol", self.tol)):
            if not (np.isfinite(number) and number > 0):
                raise ValueError(f"{key}: must be a finite number > 0, got {number!r}")
        if not 0 < self.clip_fraction <= 1:
            raise ValueError(f"clip_fraction: must be in (0, 1], got {clip_fraction!r}")
        self._rng = np.random.default_rng(seed)
        self._set_lambda(self._rng.gamma(100.0, 0.01, (self.n_topics, len(self.vocabulary))))

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """Stochastic VI over the corpus: Poisson batches of about :data:`RULE_BATCH` documents (q at
        least :data:`RULE_MIN_Q`), :data:`RULE_STEPS` steps at kappa :data:`RULE_KAPPA` (non-private:
        :data:`RULE_NON_PRIVATE_PASSES` passes), documents resampled to :data:`RULE_DOC_LENGTH` words
        and clipped at :data:`RULE_CLIP_FRACTION` of it, the settings benchmarks/lda_eval.py ran both
        its corpora with. d is the vocabulary's size V (the caller's ``vocabulary``); K stays the
        model's default.

        Why these do not depend on the budget: one step's noise on each lambda entry is z a N / q
        (z C on the sum, times D / (q D)), and for the small q of a large corpus the calibrated z
        grows like q sqrt(T), so the noise is about sqrt(T) a N / mu whatever q is (mu: the
        Gaussian-DP level of (epsilon, delta)), while the signal of an entry, D N / (K V), grows with
        the corpus. q serves the E-steps' cost and the variance of the stochastic gradient, T the
        settling of the topics from their random start; the document length scales signal and
        noise alike (both are proportional to N), so it serves the resampling's own variance
        against the E-step's cost."""
        private = not non_private
        q = min(1.0, max(RULE_MIN_Q, RULE_BATCH / n))
        steps = RULE_STEPS if private else max(RULE_STEPS, math.ceil(RULE_NON_PRIVATE_PASSES / q))
        why = {
            "q": (f"q = {q:g}: batches of about {RULE_BATCH} documents (at least {RULE_MIN_Q:g} of the corpus), "
                  "as benchmarks/lda_eval.py ran both its corpora (q = 0.2 on 2,677 news articles, 0.02 on "
                  "100,000 synthetic documents): the noise on lambda does not depend on q for small q, so q "
                  "serves the E-steps' cost and the stochastic gradient's variance"),
            "steps": (f"{steps} steps, rho_t = (1 + t)^-{RULE_KAPPA}: " + (
                "benchmarks/lda_eval.py's schedule on both corpora; z grows like sqrt(T), so few releases keep "
                "each one's share of the budget" if private else
                f"{RULE_NON_PRIVATE_PASSES} passes over the corpus (at least {RULE_STEPS} steps): no noise to "
                "average, so steps serve convergence only")),
            "doc_length": (f"documents resampled to {RULE_DOC_LENGTH} words (benchmarks/lda_eval.py's synthetic "
                           "corpus): signal and noise both scale with the length, which trades the resampling's "
                           "variance against the E-step's cost and the reservoir's memory (N words per document)"),
            "clip_fraction": (f"each document's contribution clipped to {RULE_CLIP_FRACTION:g} N (the model's "
                              "default and benchmarks/lda_eval.py's clipping, the paper's Figure 2 setting)"),
            "seed": ("not set: the initial topics and the resampling draws are public randomness (no data enters "
                     "them), drawn from the run's seed (fit's seed=, an estimator's random_state) when it is seeded, "
                     "so a seeded fit is reproduced exactly, and from OS entropy otherwise"),
        }
        if private:
            why["accountant"] = why_accountant(q)
        return Settings("lda", n, d, epsilon, delta, q, steps, 1.0, RULE_KAPPA, None,
                        model_params={"doc_length": RULE_DOC_LENGTH, "clip_fraction": RULE_CLIP_FRACTION},
                        why=why, accountant=accountant_for(q))

    @classmethod
    def regime_warning(cls, n: int, d: int, epsilon: float) -> str | None:
        """Warn at epsilon <= :data:`WEAK_EPSILON` when N / V is at most the news corpus's 2,677 / 1,000.

        Evidence: benchmarks/results/lda_eval.json, ``news`` (D = 2,677 documents, V = 1,000
        words, K = 10, 2 seeds): held-out perplexity 954, 854, 794 and 741 at epsilon 0.5, 1, 2
        and 4, every one above the unigram model's 716 (non-private 560), so the private topics
        predict held-out words worse than word frequencies alone. The noise on each released
        word-topic entry does not shrink with V while a document's clipped contribution is spread
        over more entries, so fewer documents per vocabulary word leave less signal per entry
        against the same noise, and the warning extends below the benchmark's N / V. Above it,
        or at a larger epsilon, no benchmark measured the fit's regime, and the hook says nothing."""
        if epsilon <= WEAK_EPSILON and n / d <= WEAK_DOCS_PER_WORD:
            return (f"lda at epsilon {epsilon:g} with N / V = {n / d:.3g} documents per vocabulary word (at most "
                    "2,677 / 1,000): in benchmarks/results/lda_eval.json (news, K = 10) the private topics' held-out "
                    "perplexity was above the unigram model's at every epsilon up to 4 (741 to 954 against 716; "
                    "560 non-private): expect it to learn little")
        return None

    @classmethod
    def audit(cls) -> FamilyAudit:
        """Two one-word documents on different words: orthogonal non-negative contributions at C."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "lda", lambda capacity: LDA(vocabulary=["w0", "w1", "w2", "w3"], dataset_size=capacity, n_topics=2,
                                        doc_length=8, clip_fraction=0.5, seed=0),
            ({"tokens": ["w0"] * 8}, {"tokens": ["w1"] * 8}, {"tokens": ["w0", "w1"] * 4}),
            ratio_floor=0.99, floor_reason="attained: disjoint one-word documents reach the claim",
            noise_multiplier=2.0,
            note="two one-word documents on different words: orthogonal non-negative contributions "
                 "clipped to C, ||u - v|| = sqrt(2) C, the claimed diameter (z = 2 puts the claimed "
                 "sensitivity sqrt(2)/z near the other families' 2/3)")

    # -- configuration and state ------------------------------------------------------------------

    @property
    def clip_bound(self) -> float:
        """C = a * N, the L2 bound on one document's clipped contribution."""
        return self.clip_fraction * self.doc_length

    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"words": (np.dtype(np.int32), (self.doc_length,))}

    def blocks(self) -> tuple[Block, ...]:
        return (Block("s", (self.n_topics, len(self.vocabulary)), self.clip_bound),)

    def diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """sqrt(2) for any allocation (one block): clipped contributions are entrywise
        non-negative (proof in the class docstring)."""
        return float(np.sqrt(2.0))

    def hyperparameters(self) -> dict[str, Any]:
        """Constructor arguments that shape the model; ``LDA(**hyperparameters())`` rebuilds it."""
        return {
            "vocabulary": list(self.vocabulary),
            "dataset_size": self.dataset_size,
            "n_topics": self.n_topics,
            "doc_length": self.doc_length,
            "alpha": self.alpha,
            "eta": self.eta,
            "clip_fraction": self.clip_fraction,
            "max_iter": self.max_iter,
            "tol": self.tol,
        }

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        words = hyperparameters["vocabulary"]
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise TypeError("vocabulary must be a list of words (a message never names a file)")
        return {"lambda": (integer("n_topics", hyperparameters["n_topics"]), len(words))}

    def state(self) -> dict[str, np.ndarray]:
        """``lambda`` (K x V): the Dirichlet parameters of q(beta_k)."""
        return {"lambda": self._lambda.copy()}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        if "lambda" not in state:
            raise ValueError("state: missing 'lambda'")
        lam = np.asarray(state["lambda"], dtype=np.float64)
        shape = (self.n_topics, len(self.vocabulary))
        if lam.shape != shape:
            raise ValueError(f"state.lambda: expected shape {shape}, got {lam.shape}")
        if not np.all(np.isfinite(lam)) or np.any(lam <= 0):
            raise ValueError("state.lambda: entries must be finite and > 0")
        self._set_lambda(lam.copy())

    def _set_lambda(self, lam: np.ndarray) -> None:
        self._lambda = lam
        self._exp_elog_beta = np.exp(dirichlet_expectation(lam))
        self._exp_elog_beta_t = np.ascontiguousarray(self._exp_elog_beta.T)

    # -- record handling ----------------------------------------------------------------------------

    def _bag(self, obj: Any) -> tuple[np.ndarray, np.ndarray] | tuple[str, str]:
        """(word ids, counts) of one record's known words, or (reason, detail) if it is bad."""
        if not isinstance(obj, dict):
            return NOT_OBJECT, f"expected a JSON object, got {type(obj).__name__}"
        has_t, has_c = "tokens" in obj, "counts" in obj
        if has_t == has_c:
            return MISSING_FIELD, "expected exactly one of 'tokens' or 'counts'"
        get = self._index.get
        if has_t:
            tokens = obj["tokens"]
            if not isinstance(tokens, list) or not set(map(type, tokens)) <= {str}:
                return WRONG_TYPE, "'tokens' must be a list of strings"
            ids = np.fromiter(map(get, tokens, repeat(-1)), dtype=np.int64, count=len(tokens))
            ids = ids[ids >= 0]
            cts = np.ones(len(ids), dtype=np.int64)
        else:
            counts = obj["counts"]
            if not isinstance(counts, dict) or not set(map(type, counts.values())) <= {int}:
                return WRONG_TYPE, "'counts' must map words to integers"
            try:
                vals = np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
            except OverflowError:
                vals = np.array([-1])
            if np.any(vals < 0) or np.any(vals > MAX_COUNT):
                return OUT_OF_RANGE, f"'counts' values must be integers in [0, {MAX_COUNT}]"
            ids = np.fromiter(map(get, counts.keys(), repeat(-1)), dtype=np.int64, count=len(counts))
            keep = (ids >= 0) & (vals > 0)
            ids, cts = ids[keep], vals[keep]
        if not len(ids):
            return EMPTY_DOCUMENT, "no token of the document is in the vocabulary"
        return ids, cts

    def _bags(self, objs: Sequence[Any]) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray,
                                                 list[tuple[int, str, str]]]:
        ids: list[np.ndarray] = []
        cts: list[np.ndarray] = []
        accepted: list[int] = []
        rejected: list[tuple[int, str, str]] = []
        for i, obj in enumerate(objs):
            bag = self._bag(obj)
            if isinstance(bag[0], str):
                reason, detail = bag
                rejected.append((i, reason, detail))
            else:
                word_ids, counts = bag
                ids.append(word_ids)
                cts.append(counts)
                accepted.append(i)
        return ids, cts, np.asarray(accepted, dtype=np.int64), rejected

    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        """Map tokens to ids, reject bad records, and resample each document to N words.

        The N words of a document are drawn i.i.d. from its bag of known words, each word
        with probability proportional to its count (sampling tokens with replacement), for the
        whole batch in one vectorized draw.
        """
        ids, cts, accepted, rejected = self._bags(objs)
        n, N = len(accepted), self.doc_length
        if not n:
            return ParsedBatch({"words": np.zeros((0, N), np.int32)}, accepted, rejected)
        flat_ids, cum = np.concatenate(ids), np.cumsum(np.concatenate(cts))
        ends = np.cumsum([len(a) for a in ids])
        totals = np.diff(np.concatenate(([0], cum[ends - 1])))
        draws = self._rng.integers(0, totals[:, None], size=(n, N)) + (cum[ends - 1] - totals)[:, None]
        words = flat_ids[np.searchsorted(cum, draws, side="right")].astype(np.int32)
        return ParsedBatch({"words": words}, accepted, rejected)

    def bags_of(self, objs: Sequence[Any]) -> Bags:
        """Unresampled bags of known words of valid records (held-out evaluation).

        Raises ValueError naming the first malformed record; documents with no known word are
        skipped (they add nothing to the bound or to the word count).
        """
        ids, cts, _, rejected = self._bags(objs)
        bad = [r for r in rejected if r[1] != EMPTY_DOCUMENT]
        if bad:
            i, reason, detail = bad[0]
            raise ValueError(f"document {i}: {reason}: {detail}")
        indptr = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in ids], out=indptr[1:])
        if not ids:
            return Bags(np.zeros(0, np.int64), np.zeros(0), indptr)
        flat, counts = np.concatenate(ids), np.concatenate(cts).astype(np.float64)
        # merge repeated ids within a document (tokens records list a word once per occurrence)
        doc = np.repeat(np.arange(len(ids)), np.diff(indptr))
        key = doc * len(self.vocabulary) + flat
        uniq, inv = np.unique(key, return_inverse=True)
        merged = np.bincount(inv, weights=counts)
        np.cumsum(np.bincount(uniq // len(self.vocabulary), minlength=len(ids)), out=indptr[1:])
        return Bags(uniq % len(self.vocabulary), merged, indptr)

    # -- behind the wall ----------------------------------------------------------------------------

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sum of the batch's per-document expected counts, each clipped to L2 norm a * N.

        Document d's contribution is u_dkv = theta_dk beta_kv sum_l [w_dl = v] c_dl / phinorm_dl
        (theta = exp(E[log theta_d]), beta = exp(E[log beta])); its norm comes from the E-step's
        sparse form (:attr:`EStepBlock.sq_norms`), giving the clip factor f_d. The clipped sum
        is then beta_kv * (sum_d f_d theta_dk R_dv) with R the sparse D x V matrix of
        c_dl / phinorm_dl: one sparse-dense product, never a K x V array per document.
        """
        words = np.asarray(batch["words"])
        if words.ndim != 2 or words.shape[1] != self.doc_length:
            raise ValueError(f"batch.words: expected shape (n, {self.doc_length}), got {words.shape}")
        V, K = len(self.vocabulary), self.n_topics
        if words.size and (words.min() < 0 or words.max() >= V):  # only a corrupt checkpoint gets here
            raise ValueError(f"batch.words: word ids must be in [0, {V}); the reservoir holds "
                             f"{int(words.min())}..{int(words.max())}")
        bags = Bags.from_rows(words)
        theta = np.zeros((bags.n_docs, K))
        ratios = np.zeros(len(bags.ids))  # c_dl / phinorm_dl in the Bags' CSR order
        for blk in e_step(bags, self._exp_elog_beta_t, self.alpha, self.max_iter, self.tol, self.block_size):
            theta[blk.docs] = blk.exp_elog_theta * clip_factors(np.sqrt(blk.sq_norms), self.clip_bound)[:, None]
            slot = blk.counts > 0
            pos = bags.indptr[blk.docs][:, None] + np.arange(blk.ids.shape[1])[None, :]
            ratios[pos[slot]] = (blk.counts / blk.phinorm)[slot]
        R = sp.csr_matrix((ratios, bags.ids, bags.indptr), shape=(bags.n_docs, V))
        return {"s": (R.T @ theta).T * self._exp_elog_beta}

    # -- M-step on privatized statistics ----------------------------------------------------------

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """lambda <- (1 - rho) lambda + rho (eta + D * max(s, 0)), from the noisy mean s only."""
        shape = (self.n_topics, len(self.vocabulary))
        if "s" not in noisy_mean:
            raise ValueError("noisy_mean: missing block 's'")
        s = np.asarray(noisy_mean["s"], dtype=np.float64)
        if s.shape != shape:
            raise ValueError(f"noisy_mean.s: expected shape {shape}, got {s.shape}")
        if not 0 < rho <= 1:
            raise ValueError(f"rho must be in (0, 1], got {rho!r}")
        lam_hat = self.eta + self.dataset_size * np.maximum(s, 0.0)
        self._set_lambda((1.0 - rho) * self._lambda + rho * lam_hat)

    # -- read side ------------------------------------------------------------------------------------

    def topics(self) -> np.ndarray:
        """E[beta] under q: lambda normalised per topic (K x V)."""
        return self._lambda / self._lambda.sum(axis=1, keepdims=True)

    def top_words(self, n: int = 10) -> list[list[str]]:
        """The n most probable words of each topic, most probable first."""
        top = np.argsort(-self._lambda, axis=1, kind="stable")[:, :n]
        vocab = np.asarray(self.vocabulary, dtype=object)
        return [list(vocab[row]) for row in top]

    def summary(self) -> dict[str, Any]:
        """The topic-word means E[beta] (in full up to :data:`~stream_vips.models.summaries.TABLE_LIMIT`
        entries) and each topic's eight most probable words with their means."""
        beta = self.topics()
        top = np.argsort(-self._lambda, axis=1, kind="stable")[:, :8]
        vocab = np.asarray(self.vocabulary, dtype=object)
        out: dict[str, Any] = {
            "kind": "topics",
            "predictive": "E[beta_kv] = lambda_kv / sum_w lambda_kw; a document's topic proportions need "
                          "the E-step over the full lambda",
            "alpha": self.alpha,
            "top_words": [list(map(str, vocab[row])) for row in top],
            "top_word_means": np.take_along_axis(beta, top, axis=1).tolist(),
        }
        if beta.size <= summaries.TABLE_LIMIT:
            out["topic_word_means"] = beta.tolist()
            out["notes"] = []
        else:
            out["notes"] = [f"topic_word_means omitted (K x V = {beta.size} > {summaries.TABLE_LIMIT}): "
                            "normalise the rows of the natural parameter lambda"]
        return out

    def perplexity(self, docs: Sequence[Any]) -> float:
        """Held-out per-word perplexity bound of the documents alone (paper eq. 32; Hoffman et al. 2010).

        For each document (all its known words, not resampled), the E-step gives q(theta_d)
        and q(z_d) at the current lambda; the bound is exp(-sum_d ELBO_d / sum_d n_d) with
        ELBO_d = sum_v n_dv log sum_k exp(E[log theta_dk] + E[log beta_kv])
               + sum_k (alpha - gamma_dk) E[log theta_dk] + sum_k log Gamma(gamma_dk)
               - log Gamma(sum_k gamma_dk) + log Gamma(K alpha) - K log Gamma(alpha),
        where the first line is E_q[log p(n_d, z_d | theta_d, beta)] - E_q[log q(z_d)] at the
        optimal phi. It leaves out the topics' own term E_q[log p(beta) - log q(beta)] (<= 0), so
        it is below scikit-learn's ``perplexity`` and gensim's ``exp(-log_perplexity)`` on the same
        topics, by the factor exp(-KL(q(beta) || p(beta)) / sum_d n_d);
        :meth:`held_out_perplexity` is the number they report. Kept for the paper's figures
        (benchmarks/paper_claims.py compares variants with it).
        """
        bags = self.bags_of(docs)
        n_words = bags.counts.sum()
        if n_words == 0:
            raise ValueError("perplexity: no document has a word in the vocabulary")
        return float(np.exp(-self._documents_bound(bags) / n_words))

    def per_word_bound(self, docs: Sequence[Any], total_docs: int | None = None) -> float:
        """Held-out per-word log-likelihood bound (nats per word), as scikit-learn and gensim compute it.

        The evidence lower bound of the held-out documents with theta inferred on them (the
        E-step of :meth:`perplexity`, topics fixed at their posterior q(beta) = Dirichlet(lambda)),
        including the topics' term, divided by the documents' known words n:

            bound = (r * sum_d ELBO_d + E_q[log p(beta | eta) - log q(beta | lambda)]) / (r * n),

        E_q[log p(beta | eta) - log q(beta | lambda)] = sum_kv (eta - lambda_kv) E[log beta_kv]
        + sum_kv (log Gamma(lambda_kv) - log Gamma(eta)) + sum_k (log Gamma(V eta) - log Gamma(sum_v lambda_kv)),

        with ELBO_d as in :meth:`perplexity` and r = ``total_docs`` / (number of documents given)
        (1 when ``total_docs`` is None). This is scikit-learn's
        ``LatentDirichletAllocation._approx_bound(X) / X.sum()`` (so ``exp(-bound)`` is its
        ``perplexity(X)``; ``total_docs`` its ``sub_sampling=True`` with ``total_samples``) and
        gensim's ``LdaModel.log_perplexity(chunk, total_docs)``, given the same topics and priors:
        all three run the same mean-field fixed point for gamma, started differently (here at
        alpha + n_d / K, scikit-learn at 1, gensim at random), and stop at a mean absolute change
        of gamma below ``tol``. Because the bound is stationary in gamma at the fixed point,
        their numbers agree to second order in that residual. The topics' term is a fixed cost
        spread over the held-out words: the number depends on how many words are held out.
        """
        bags = self.bags_of(docs)
        n_words = float(bags.counts.sum())
        if n_words == 0:
            raise ValueError("per_word_bound: no document has a word in the vocabulary")
        ratio = 1.0
        if total_docs is not None:
            if isinstance(total_docs, bool) or not isinstance(total_docs, (int, np.integer)) \
                    or total_docs < len(docs):
                raise ValueError(f"total_docs: must be an integer >= the {len(docs)} documents given, "
                                 f"got {total_docs!r}")
            ratio = int(total_docs) / len(docs)
        return (ratio * self._documents_bound(bags) + self.topics_bound()) / (ratio * n_words)

    def held_out_perplexity(self, docs: Sequence[Any], total_docs: int | None = None) -> float:
        """exp(-:meth:`per_word_bound`): scikit-learn's ``LatentDirichletAllocation.perplexity``
        on the same topics (lower is better)."""
        return float(np.exp(-self.per_word_bound(docs, total_docs)))

    def topics_bound(self) -> float:
        """E_q[log p(beta | eta) - log q(beta | lambda)] = -KL(q(beta) || p(beta)) <= 0, summed over
        the K topics (0 exactly when lambda = eta: the posterior is the prior)."""
        lam, eta = self._lambda, self.eta
        V = lam.shape[1]
        return float(((eta - lam) * dirichlet_expectation(lam)).sum() + (gammaln(lam) - gammaln(eta)).sum()
                     + (gammaln(V * eta) - gammaln(lam.sum(axis=1))).sum())

    def _documents_bound(self, bags: Bags) -> float:
        """sum_d ELBO_d of :meth:`perplexity` (theta inferred per document, topics fixed)."""
        K, a = self.n_topics, self.alpha
        elbo = 0.0
        for blk in e_step(bags, self._exp_elog_beta_t, a, self.max_iter, self.tol, self.block_size):
            elog_theta = dirichlet_expectation(blk.gamma)
            elbo += float((blk.counts * np.log(blk.phinorm)).sum())
            elbo += float(((a - blk.gamma) * elog_theta + gammaln(blk.gamma)).sum())
            elbo += float((gammaln(K * a) - K * gammaln(a) - gammaln(blk.gamma.sum(axis=1))).sum())
        return elbo
