"""VIPS LDA (paper section 4, Algorithm 3): the vectorized E-step and M-step against a plain loop
implementation, sparse clipping norms against dense ones, the sqrt(2) replace-one diameter, the
engine's noise std z * a * N, epsilon in the message equal to the ledger's, record handling."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import gammaln, psi

from stream_vips import messages
from stream_vips.config import check_kwargs
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler, PoissonSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models import model_class
from stream_vips.models.lda import LDA, Bags, _theta_phinorm, e_step, hellinger, topic_recovery
from stream_vips.privacy.accountants import PldAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import MemoryLedger

VOCAB = [f"w{i}" for i in range(12)]


def tiny_corpus(seed: int, n_docs: int, vocab=VOCAB, length: int = 15) -> list[dict]:
    """Documents mixing two planted halves of the vocabulary, as token lists."""
    rng = np.random.default_rng(seed)
    half = len(vocab) // 2
    docs = []
    for _ in range(n_docs):
        w = rng.dirichlet([0.3, 0.3])
        p = np.concatenate([np.full(half, w[0]), np.full(len(vocab) - half, w[1])])
        docs.append({"tokens": [vocab[i] for i in rng.choice(len(vocab), length, p=p / p.sum())]})
    return docs


# --------------------------------------------------------------------------------------------
# A straightforward loop implementation of the same E-step and M-step (the reference).


def ref_exp_elog(x):
    total = sum(x)
    return [math.exp(psi(v) - psi(total)) for v in x]


def ref_doc(counts: dict[int, float], eb, alpha, max_iter, tol):
    """Per-document fixed point; returns gamma, exp E[log theta], phi[w][k], phinorm[w] and the
    number of iterations run."""
    K = len(eb)
    n = sum(counts.values())
    gamma = [alpha + n / K] * K
    for iterations in range(1, max_iter + 1):  # noqa: B007 (its last value is returned)
        t = ref_exp_elog(gamma)
        phinorm = {w: sum(t[k] * eb[k][w] for k in range(K)) + 1e-100 for w in counts}
        new = [alpha + t[k] * sum(c * eb[k][w] / phinorm[w] for w, c in counts.items()) for k in range(K)]
        change = sum(abs(a - b) for a, b in zip(new, gamma)) / K
        gamma = new
        if change < tol:
            break
    t = ref_exp_elog(gamma)
    phinorm = {w: sum(t[k] * eb[k][w] for k in range(K)) + 1e-100 for w in counts}
    phi = {w: [t[k] * eb[k][w] / phinorm[w] for k in range(K)] for w in counts}
    return gamma, t, phi, phinorm, iterations


def ref_step(lam, rows, alpha, eta, a, N, D, rho, max_iter, tol, normaliser):
    """One Algorithm 3 step at z = 0 with explicit loops over documents, words and topics."""
    K, V = len(lam), len(lam[0])
    eb = []
    for k in range(K):
        total = sum(lam[k])
        eb.append([math.exp(psi(lam[k][v]) - psi(total)) for v in range(V)])
    s = [[0.0] * V for _ in range(K)]
    for row in rows:
        counts: dict[int, float] = {}
        for w in row:
            counts[int(w)] = counts.get(int(w), 0.0) + 1.0
        _, _, phi, _, _ = ref_doc(counts, eb, alpha, max_iter, tol)
        contrib = [[0.0] * V for _ in range(K)]
        for w, c in counts.items():
            for k in range(K):
                contrib[k][w] += c * phi[w][k]
        norm = math.sqrt(sum(x * x for r in contrib for x in r))
        f = min(1.0, a * N / norm)
        for k in range(K):
            for v in range(V):
                s[k][v] += f * contrib[k][v]
    new = [[0.0] * V for _ in range(K)]
    for k in range(K):
        for v in range(V):
            sv = max(s[k][v] / normaliser, 0.0)
            new[k][v] = (1 - rho) * lam[k][v] + rho * (eta + D * sv)
    return new


def ref_perplexity(lam, docs_counts, alpha, max_iter, tol):
    K, V = len(lam), len(lam[0])
    eb = []
    for k in range(K):
        total = sum(lam[k])
        eb.append([math.exp(psi(lam[k][v]) - psi(total)) for v in range(V)])
    elbo, words = 0.0, 0.0
    for counts in docs_counts:
        gamma, t, _, phinorm, _ = ref_doc(counts, eb, alpha, max_iter, tol)
        elog = [math.log(x) for x in t]
        elbo += sum(c * math.log(phinorm[w]) for w, c in counts.items())
        elbo += sum((alpha - g) * e + gammaln(g) for g, e in zip(gamma, elog))
        elbo += gammaln(K * alpha) - K * gammaln(alpha) - gammaln(sum(gamma))
        words += sum(counts.values())
    return math.exp(-elbo / words)


# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip_fraction", [0.1, 1.0])
def test_z0_matches_loop_implementation(clip_fraction):
    N, D, S = 20, 50, 7
    model = LDA(VOCAB, dataset_size=D, n_topics=3, doc_length=N, alpha=0.4, eta=0.05,
                clip_fraction=clip_fraction, max_iter=40, tol=1e-4, block_size=3, seed=1)
    rows = model.parse_batch(tiny_corpus(0, S)).rows["words"]
    lam = model.state()["lambda"].tolist()
    for rho in (0.7, 0.4):  # two steps: the second E-step runs at an updated lambda
        sums = model.clipped_sum({"words": rows})
        model.update({"s": sums["s"] / S}, rho)
        lam = ref_step(lam, rows, 0.4, 0.05, clip_fraction, N, D, rho, 40, 1e-4, S)
        np.testing.assert_allclose(model.state()["lambda"], np.array(lam), rtol=0, atol=1e-8)


def test_z0_through_the_engine_in_non_private_mode():
    N, M = 20, 6
    model = LDA(VOCAB, dataset_size=M, n_topics=2, doc_length=N, max_iter=30, tol=1e-4, seed=3)
    rows = model.parse_batch(tiny_corpus(1, M)).rows["words"]
    res = Reservoir(model.row_layout(), M, np.random.default_rng(0))
    res.add_batch({"words": rows})
    lam0 = model.state()["lambda"].tolist()
    eng = PrivateEngine(model, res, FixedSizeSampler(M), None, 0.0, np.random.default_rng(0), tau0=3.0,
                        kappa=0.7, accountant_name="none", non_private=True)
    result = eng.step()
    expected = ref_step(lam0, rows, model.alpha, model.eta, model.clip_fraction, N, M, result.rho, 30, 1e-4, M)
    np.testing.assert_allclose(model.state()["lambda"], np.array(expected), rtol=0, atol=1e-8)
    report = eng.privacy_report(steps=result.step + 1, halted=False)
    assert report["epsilon_spent"] is None and not report["private"] and report["noise_multiplier"] == 0.0


def test_perplexity_matches_loop_implementation_of_eq32():
    model = LDA(VOCAB, dataset_size=30, n_topics=3, doc_length=20, alpha=0.3, max_iter=50, tol=1e-5, seed=2)
    model.update({"s": model.clipped_sum(model.parse_batch(tiny_corpus(2, 30)).rows)["s"] / 30}, 0.9)
    held_out = tiny_corpus(3, 9) + [{"counts": {"w1": 4, "w7": 2, "nope": 5}}, {"tokens": ["nope"]}]
    counts = []
    for doc in held_out[:-1]:  # the last one has no known word: it adds nothing
        c: dict[int, float] = {}
        items = doc["counts"].items() if "counts" in doc else [(t, 1) for t in doc["tokens"]]
        for word, n in items:
            if word in VOCAB:
                c[VOCAB.index(word)] = c.get(VOCAB.index(word), 0.0) + n
        counts.append(c)
    ref = ref_perplexity(model.state()["lambda"].tolist(), counts, 0.3, 50, 1e-5)
    assert model.perplexity(held_out) == pytest.approx(ref, rel=1e-10)
    with pytest.raises(ValueError, match="document 0: not_object"):
        model.perplexity(["text"])


@pytest.mark.parametrize("block_size, cache_bytes", [(1, 1 << 20), (4, 1 << 20), (128, 1 << 20), (128, 2000)])
def test_vectorized_e_step_matches_per_document_reference(block_size, cache_bytes):
    """Every document's gamma, exp E[log theta], phinorm and iteration count equal the plain
    per-document loop, for any blocking (one document per block, several, all, or blocks cut by
    the cache budget), while documents converge at different iterations (compaction runs) and some
    run to the cap."""
    K, alpha, tol = 4, 0.05, 1e-6
    model = LDA(VOCAB, dataset_size=30, n_topics=K, doc_length=25, alpha=alpha, seed=7)
    docs = tiny_corpus(5, 40, length=25)
    model.update({"s": model.clipped_sum(model.parse_batch(docs).rows)["s"] / 40}, 0.8)  # topics with structure
    rows = model.parse_batch(docs).rows["words"]
    bags = Bags.from_rows(rows)
    eb = model._exp_elog_beta_t.T.tolist()
    blocks = list(e_step(bags, model._exp_elog_beta_t, alpha, 60, tol, block_size, cache_bytes))
    assert sorted(np.concatenate([b.docs for b in blocks]).tolist()) == list(range(len(rows)))
    iterations = []
    for blk in blocks:
        for b, d in enumerate(blk.docs):
            ids, cts = bags.ids[bags.indptr[d]:bags.indptr[d + 1]], bags.counts[bags.indptr[d]:bags.indptr[d + 1]]
            gamma, t, _, phinorm, its = ref_doc(dict(zip(ids.tolist(), cts.tolist())), eb, alpha, 60, tol)
            n = len(ids)
            np.testing.assert_array_equal(blk.ids[b, :n], ids)
            assert not blk.counts[b, n:].any()
            np.testing.assert_allclose(blk.gamma[b], gamma, rtol=1e-11)
            np.testing.assert_allclose(blk.exp_elog_theta[b], t, rtol=1e-11)
            np.testing.assert_allclose(blk.phinorm[b, :n], [phinorm[w] for w in ids.tolist()], rtol=1e-11)
            assert blk.iterations[b] == its
            iterations.append(its)
    assert len(set(iterations)) > 3 and min(iterations) < 60 == max(iterations)  # early stops and the cap


def test_digamma_skipped_only_where_gamma_is_exactly_alpha():
    """theta from the shortcut (psi(alpha) copied where gamma == alpha) is bit-for-bit the plain
    exp(psi(gamma) - psi(sum gamma)), whichever branch runs."""
    rng = np.random.default_rng(8)
    alpha, K, L = 0.02, 30, 7
    beta = rng.gamma(1.0, 1.0, (5, L, K))
    for share in (0.0, 0.4, 0.9, 1.0):
        gamma = np.where(rng.random((5, K)) < share, alpha, rng.gamma(2.0, 5.0, (5, K)))
        theta, phinorm = np.empty((5, K)), np.empty((5, L))
        _theta_phinorm(gamma, beta, theta, phinorm, np.empty(5), np.empty((5, K), bool), alpha, float(psi(alpha)))
        plain = np.exp(psi(gamma) - psi(gamma @ np.ones(K))[:, None])
        np.testing.assert_array_equal(theta, plain)
        np.testing.assert_allclose(phinorm, (beta @ plain[:, :, None])[:, :, 0] + 1e-100, rtol=1e-14)


def test_sparse_clipping_norms_equal_dense():
    rng = np.random.default_rng(4)
    V, K, N = 300, 5, 60
    vocab = [f"v{i}" for i in range(V)]
    model = LDA(vocab, dataset_size=100, n_topics=K, doc_length=N, seed=5, block_size=4)
    rows = rng.integers(0, V, size=(23, N)).astype(np.int32)
    bags = Bags.from_rows(rows)
    eb = model._exp_elog_beta_t.T
    seen = 0
    for blk in e_step(bags, model._exp_elog_beta_t, model.alpha, model.max_iter, model.tol, model.block_size):
        for b, d in enumerate(blk.docs):
            dense = np.zeros((K, V))  # c_dv phi_dvk, one word slot at a time
            for slot in range(len(blk.ids[b])):
                v = blk.ids[b, slot]
                dense[:, v] += blk.counts[b, slot] * blk.exp_elog_theta[b] * eb[:, v] / blk.phinorm[b, slot]
            assert np.linalg.norm(dense) == pytest.approx(np.sqrt(blk.sq_norms[b]), rel=1e-12)
            assert dense.sum() == pytest.approx(N, rel=1e-12)  # expected counts sum to N
            np.testing.assert_array_equal(np.flatnonzero(dense.sum(0)), np.unique(rows[d]))
            seen += 1
    assert seen == 23


def test_document_exceeding_the_bound_is_clipped_and_others_are_not():
    N, K, a = 40, 4, 0.1
    model = LDA(VOCAB, dataset_size=10, n_topics=K, doc_length=N, clip_fraction=a, seed=6)
    # one word N times: one column summing to N, norm >= N / sqrt(K) = 20 > a N = 4
    big = model.clipped_sum({"words": np.full((1, N), 3, np.int32)})["s"]
    assert np.linalg.norm(big) == pytest.approx(a * N, rel=1e-12)
    assert np.all(big >= 0) and np.count_nonzero(big.sum(0)) == 1
    empty = model.clipped_sum({"words": np.zeros((0, N), np.int32)})["s"]  # Poisson can draw no one
    assert empty.shape == (K, len(VOCAB)) and not empty.any()
    # with a = 1 nothing can exceed the bound (norm <= N): the contribution sums to N, unscaled
    loose = LDA(VOCAB, dataset_size=10, n_topics=K, doc_length=N, clip_fraction=1.0, seed=6)
    one = loose.clipped_sum({"words": np.full((1, N), 3, np.int32)})["s"]
    assert one.sum() == pytest.approx(N, rel=1e-12)
    np.testing.assert_allclose(big, one * (a * N / np.linalg.norm(one)), rtol=1e-12)


@pytest.mark.parametrize("bad", [-1, len(VOCAB), 2**31 - 1])
def test_word_ids_outside_the_vocabulary_are_refused_behind_the_wall(bad):
    """Parsing never lets such ids in; a corrupt checkpoint could. They must not index memory
    (a negative id once corrupted the heap) and nothing is released: the refusal comes before
    any budget check."""
    model = LDA(VOCAB, dataset_size=10, n_topics=4, doc_length=5, seed=6)
    words = np.zeros((3, 5), np.int32)
    words[1, 2] = bad
    with pytest.raises(ValueError, match=r"word ids must be in \[0, "):
        model.clipped_sum({"words": words})


@pytest.mark.parametrize("shape", [(3, 6), (3, 4), (15,), (3, 5, 1)])
def test_a_batch_of_the_wrong_shape_is_refused_behind_the_wall(shape):
    """Documents are resampled to doc_length words: rows of any other length (or an array of
    another rank, from a corrupt checkpoint) are refused before any E-step, naming the shape."""
    model = LDA(VOCAB, dataset_size=10, n_topics=4, doc_length=5, seed=6)
    with pytest.raises(ValueError, match=r"expected shape \(n, 5\)"):
        model.clipped_sum({"words": np.zeros(shape, np.int32)})


def test_replace_one_diameter_is_sqrt2_for_nonnegative_clipped_contributions():
    model = LDA(VOCAB, dataset_size=10, n_topics=3, doc_length=30, seed=7)
    assert model.diameter() == pytest.approx(math.sqrt(2), rel=1e-15)
    C = model.clip_bound
    rng = np.random.default_rng(8)
    # random non-negative vectors of norm <= C, sparse and dense, including disjoint supports
    u = rng.exponential(size=(20000, 36)) * (rng.random((20000, 36)) < rng.random((20000, 1)))
    v = rng.exponential(size=(20000, 36)) * (rng.random((20000, 36)) < rng.random((20000, 1)))
    def clip(x: np.ndarray) -> np.ndarray:
        return x * np.minimum(1.0, C / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-300))

    u, v = clip(u), clip(v)
    gaps = np.linalg.norm(u - v, axis=1)
    assert gaps.max() <= math.sqrt(2) * C * (1 + 1e-12)
    assert gaps.max() > 1.3 * C  # the bound is nearly attained (disjoint supports), so 2C would be loose
    # real contributions of two single-word documents: disjoint columns, so the gap is exactly sqrt(2) C
    s1 = model.clipped_sum({"words": np.full((1, 30), 1, np.int32)})["s"]
    s2 = model.clipped_sum({"words": np.full((1, 30), 9, np.int32)})["s"]
    assert np.linalg.norm(s1 - s2) == pytest.approx(math.sqrt(2) * C, rel=1e-12)


def test_engine_noise_std_is_z_a_N_and_message_epsilon_is_the_ledgers():
    V, K, N, M, z = 300, 4, 50, 20, 5.0
    vocab = [f"v{i}" for i in range(V)]
    model = LDA(vocab, dataset_size=M, n_topics=K, doc_length=N, clip_fraction=0.1, seed=9)
    rng = np.random.default_rng(10)
    docs = [{"tokens": [vocab[i] for i in rng.integers(0, V, 30)]} for _ in range(M)]
    res = Reservoir(model.row_layout(), M, np.random.default_rng(0))
    res.add_batch(model.parse_batch(docs).rows)
    ledger = MemoryLedger()
    monitor = BudgetMonitor(0.5, 1e-5, PldAccountant(), ledger)  # room for 2 steps (eps ~0.40)
    sampler = PoissonSampler(0.2)
    eng = PrivateEngine(model, res, sampler, monitor, z, np.random.default_rng(11), tau0=1.0,
                        kappa=0.7, accountant_name="pld", seeded=True)
    assert eng.block_stds == {"s": pytest.approx(z * 0.1 * N, rel=1e-12)}
    sums, means = [], []
    real_sum, real_update = model.clipped_sum, model.update
    model.clipped_sum = lambda batch: (lambda out: (sums.append(out["s"].copy()), out)[1])(real_sum(batch))
    model.update = lambda mean, rho: (means.append(mean["s"].copy()), real_update(mean, rho))[1]
    results = [eng.step() for _ in range(2)]
    noise = np.stack(means) * sampler.normaliser(M) - np.stack(sums)  # the noise added to each sum
    n = noise.size
    assert noise.std() == pytest.approx(z * 0.1 * N, rel=5 / math.sqrt(2 * n))
    assert abs(noise.mean()) < 5 * z * 0.1 * N / math.sqrt(n)
    # ledger events carry the sqrt(2) diameter; published epsilon = the ledger's epsilon
    assert all(e.diameter == pytest.approx(math.sqrt(2)) for e in ledger.events())
    eps = PldAccountant().epsilon(ledger.events(), 1e-5)
    msg = messages.build_message("m", LDA.family, model.hyperparameters(), results[-1].step, model.state(),
                                 eng.privacy_report(steps=results[-1].step + 1, halted=False))
    assert msg["privacy"]["epsilon_spent"] == pytest.approx(eps, rel=1e-9)
    assert msg["privacy"]["epsilon_spent"] == monitor.spent()
    assert msg["privacy"]["paper_sigma"] == pytest.approx(z / math.sqrt(2))
    rebuilt = LDA(**msg["hyperparameters"])
    rebuilt.load_state(messages.decode_state(msg))
    np.testing.assert_array_equal(rebuilt.state()["lambda"], model.state()["lambda"])


def test_m_step_sets_negative_noisy_statistics_to_zero():
    model = LDA(VOCAB[:4], dataset_size=100, n_topics=2, doc_length=10, eta=0.05, seed=0)
    lam = model.state()["lambda"]
    s = np.array([[-0.3, 0.2, 0.0, -1e-9], [0.01, -5.0, 1.0, 0.5]])
    model.update({"s": s}, 0.25)
    expected = 0.75 * lam + 0.25 * (0.05 + 100 * np.maximum(s, 0))
    np.testing.assert_allclose(model.state()["lambda"], expected, rtol=1e-15)
    with pytest.raises(ValueError, match="noisy_mean.s: expected shape"):
        model.update({"s": s[:, :3]}, 0.25)


def test_parse_rejects_bad_input_with_reasons():
    model = LDA(["a", "b", "c"], dataset_size=10, n_topics=2, doc_length=6, seed=0)
    objs = [
        {"tokens": ["a", "zzz", "b"]},
        {"counts": {"c": 2, "zzz": 9}},
        "plain text",
        {"text": "a b"},
        {"tokens": ["a"], "counts": {"a": 1}},
        {"tokens": "a b"},
        {"tokens": ["a", 3]},
        {"counts": {"a": 1.5}},
        {"counts": {"a": -1}},
        {"counts": {"a": 2**40}},
        {"tokens": ["zzz", "yyy"]},
        {"counts": {"a": 0, "zzz": 3}},
        {"tokens": []},
        {"counts": {"b": True}},
    ]
    parsed = model.parse_batch(objs)
    assert parsed.accepted.tolist() == [0, 1]
    assert [(i, r) for i, r, _ in parsed.rejected] == [
        (2, "not_object"), (3, "missing_field"), (4, "missing_field"), (5, "wrong_type"), (6, "wrong_type"),
        (7, "wrong_type"), (8, "out_of_range"), (9, "out_of_range"), (10, "empty_document"),
        (11, "empty_document"), (12, "empty_document"), (13, "wrong_type"),
    ]
    assert all(detail for _, _, detail in parsed.rejected)
    words = parsed.rows["words"]
    assert words.dtype == np.int32 and words.shape == (2, 6)
    assert set(words[0]) <= {0, 1} and set(words[1]) == {2}  # unknown tokens dropped


def test_resampling_draws_words_in_proportion_to_counts():
    N = 4000
    model = LDA(["a", "b", "c"], dataset_size=10, n_topics=2, doc_length=N, seed=1)
    words = model.parse_batch([{"counts": {"a": 3, "b": 1}}, {"tokens": ["c", "b", "c", "c"]}]).rows["words"]
    # binomial proportions: sd = sqrt(p (1 - p) / N) ~ 0.0068; allow 5 sd
    assert np.mean(words[0] == 0) == pytest.approx(0.75, abs=5 * math.sqrt(0.75 * 0.25 / N))
    assert np.mean(words[1] == 2) == pytest.approx(0.75, abs=5 * math.sqrt(0.75 * 0.25 / N))
    assert set(words[0]) == {0, 1} and set(words[1]) == {1, 2}


def test_configuration_errors_name_the_key(tmp_path):
    for kwargs, key in [({"vocabulary": []}, "vocabulary"), ({"vocabulary": ["a", "a"]}, "vocabulary"),
                        ({"clip_fraction": 0.0}, "clip_fraction"), ({"n_topics": 0}, "n_topics"),
                        ({"eta": -1.0}, "eta"), ({"vocabulary": str(tmp_path / "missing.txt")}, "vocabulary")]:
        args = {"vocabulary": ["a", "b"], "dataset_size": 10, **kwargs}
        with pytest.raises(ValueError, match=f"^{key}:"):
            LDA(**args)
    path = tmp_path / "vocab.txt"
    path.write_text("apple\npear\n\nplum\n", encoding="utf-8")
    assert LDA(str(path), dataset_size=5).vocabulary == ["apple", "pear", "plum"]
    assert model_class("lda") is LDA
    assert check_kwargs(LDA, {"vocabulary": str(path), "dataset_size": 5, "n_topics": 3}, "model.params")


def test_top_words_and_topic_recovery():
    model = LDA(VOCAB, dataset_size=10, n_topics=2, doc_length=10, seed=0)
    lam = np.full((2, 12), 0.1)
    lam[0, [4, 2, 7]] = [30, 20, 10]
    lam[1, [11, 0]] = [5, 50]
    model.load_state({"lambda": lam})
    assert [t[:3] for t in model.top_words(3)] == [["w4", "w2", "w7"], ["w0", "w11", "w1"]]
    topics = model.topics()
    assert topic_recovery(topics, topics[::-1]) == pytest.approx(0.0, abs=1e-7)
    # two-word closed form: H(p, q)^2 = 1 - sum sqrt(p q)
    p, q = np.array([[0.5, 0.5]]), np.array([[0.9, 0.1]])
    assert hellinger(p, q)[0, 0] == pytest.approx(math.sqrt(1 - (math.sqrt(0.45) + math.sqrt(0.05))), rel=1e-9)
    assert topic_recovery(np.eye(3), np.eye(3)[[2, 0, 1]]) == pytest.approx(0.0, abs=1e-12)
    assert topic_recovery(np.eye(2), np.array([[0.0, 1.0], [0.0, 1.0]])) == pytest.approx(0.5, rel=1e-12)


def test_pipeline_run_publishes_lda_with_the_ledgers_epsilon():
    """`stream-vips run` path: config -> Application with memory connectors -> messages."""
    from connectors.memory import MemoryDeadLetterSink, MemorySink, MemorySource
    from stream_vips.client import posterior_from_message
    from stream_vips.service.app import Application
    from stream_vips.service.build import config_from_dict

    rng = np.random.default_rng(20)
    vocab = [f"w{i}" for i in range(20)]
    docs = [{"tokens": [vocab[j] for j in rng.integers(10 * t, 10 * t + 10, 30)] + ["unknown"]}
            for t in rng.integers(0, 2, 300)]
    cfg = config_from_dict({
        "model": {"family": "lda", "id": "topics",
                  "params": {"vocabulary": vocab, "n_topics": 2, "doc_length": 30, "seed": 0}},
        "privacy": {"epsilon": 1.0, "noise_multiplier": 3.0, "seed": 1, "ledger": {"type": "memory"}},
        "sampling": {"reservoir": 200, "batch_size": 50},
        "schedule": {"every_records": 10, "tau0": 1.0},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit"},
    })
    ledger, sink, dead = MemoryLedger(), MemorySink(), MemoryDeadLetterSink()
    source = MemorySource(docs + [{"tokens": ["unknown"]}, [1, 2]])
    Application.from_config(cfg, source=source, sink=sink, dead_letter=dead, ledger=ledger).run()
    assert [letter.reason for letter in dead.letters] == ["empty_document", "not_object"]
    assert sink.messages and ledger.events()
    msg = sink.messages[-1][1]
    assert msg["family"] == "lda" and msg["hyperparameters"]["dataset_size"] == 200  # D defaults to M
    assert msg["version"] == len(ledger.events()) - 1
    assert msg["privacy"]["epsilon_spent"] == pytest.approx(PldAccountant().epsilon(ledger.events(), 1e-5), rel=1e-9)
    assert msg["privacy"]["epsilon_spent"] <= 1.0
    model = posterior_from_message(msg).model  # a reader rebuilds the published posterior
    np.testing.assert_array_equal(model.state()["lambda"], messages.decode_state(msg)["lambda"])
    assert model.vocabulary == vocab and model.dataset_size == 200


# --------------------------------------------------------------------------------------------
# The held-out per-word bound that scikit-learn and gensim report.

def fitted_like(seed: int, tol: float, max_iter: int) -> tuple[LDA, list[dict], np.ndarray]:
    """An LDA whose lambda is a posterior-like draw around planted topics, 200 held-out documents
    from those topics and their document-word count matrix."""
    from stream_vips.models.lda import DocumentData

    rng = np.random.default_rng(seed)
    data = DocumentData(rng, n_topics=4, vocabulary_size=40, doc_length=30, alpha=0.3)
    model = LDA(vocabulary=data.vocabulary, dataset_size=1000, n_topics=4, alpha=0.3, eta=0.05, tol=tol,
                max_iter=max_iter, seed=seed)
    model.load_state({"lambda": 0.05 + 7500.0 * data.topics * rng.gamma(20.0, 1 / 20.0, data.topics.shape)})
    docs = [{"tokens": doc} for doc in data.documents(200)]
    counts = np.zeros((len(docs), len(data.vocabulary)))
    for i, doc in enumerate(docs):
        np.add.at(counts[i], [int(w[1:]) for w in doc["tokens"]], 1.0)
    return model, docs, counts


def sklearn_on_the_same_topics(model: LDA) -> object:
    """scikit-learn's LDA holding ``model``'s lambda as its components_ (what a fit would leave)."""
    decomposition = pytest.importorskip("sklearn.decomposition")
    from stream_vips.models.lda import dirichlet_expectation

    lam = model.state()["lambda"]
    sk = decomposition.LatentDirichletAllocation(n_components=model.n_topics, doc_topic_prior=model.alpha,
                                                 topic_word_prior=model.eta, max_doc_update_iter=model.max_iter,
                                                 mean_change_tol=model.tol)
    sk.components_, sk.exp_dirichlet_component_ = lam, np.exp(dirichlet_expectation(lam))
    sk.doc_topic_prior_, sk.topic_word_prior_, sk.n_features_in_ = model.alpha, model.eta, lam.shape[1]
    return sk


# Both E-steps iterate the same fixed point (gamma = alpha + theta * sum_v n_v beta_v / phinorm_v)
# from different starts and stop when gamma's mean absolute change is below tol. The bound is
# stationary in gamma there, so the two differ by O(tol^2) in the bound (relative ~1e-20 at tol
# 1e-10, ~1e-6 at the default 1e-3); float64 sums of ~10^4 terms of size ~10 add ~1e-12.
@pytest.mark.parametrize("tol, max_iter, rtol", [(1e-10, 2000, 1e-9), (1e-3, 100, 1e-6)])
def test_held_out_perplexity_is_scikit_learns_on_the_same_topics(tol, max_iter, rtol):
    model, docs, counts = fitted_like(0, tol, max_iter)
    sk = sklearn_on_the_same_topics(model)
    assert model.held_out_perplexity(docs) == pytest.approx(sk.perplexity(counts), rel=rtol)
    sk.total_samples = 5_000  # the documents as a subsample of a larger corpus (gensim's total_docs)
    assert model.held_out_perplexity(docs, total_docs=5_000) == pytest.approx(
        sk.perplexity(counts, sub_sampling=True), rel=rtol)
    assert model.per_word_bound(docs) == pytest.approx(-math.log(sk.perplexity(counts)), rel=rtol)


def test_the_old_perplexity_leaves_out_the_topics_term():
    """held_out_perplexity / perplexity = exp(KL(q(beta) || p(beta)) / n): equal at the prior
    (lambda = eta, KL = 0), above it for any informative lambda."""
    model, docs, counts = fitted_like(1, 1e-3, 100)
    n = counts.sum()
    kl = -model.topics_bound()
    assert kl > 0
    assert math.log(model.held_out_perplexity(docs) / model.perplexity(docs)) == pytest.approx(kl / n, rel=1e-9)
    model.load_state({"lambda": np.full((model.n_topics, len(model.vocabulary)), model.eta)})
    assert model.topics_bound() == pytest.approx(0.0, abs=1e-9)
    assert model.held_out_perplexity(docs) == pytest.approx(model.perplexity(docs), rel=1e-12)


def test_total_docs_must_cover_the_documents_given():
    model, docs, _ = fitted_like(2, 1e-3, 100)
    with pytest.raises(ValueError, match="total_docs"):
        model.per_word_bound(docs, total_docs=len(docs) - 1)
    with pytest.raises(ValueError, match="no document"):
        model.per_word_bound([{"tokens": ["not-a-word"]}])
