"""Tests of the sigmoid belief network family (stream_vips.models.sbn)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import expit

from stream_vips.client import posterior_from_message
from stream_vips.core.learner import PrivateLearner
from stream_vips.models.logistic import pg_mean
from stream_vips.models.sbn import RULE_CLIP, SigmoidBeliefNetwork, fit_rule, pixel_accuracy

#: Block name -> upper end of the interval [0, upper] every entry of a record's contribution lies in.
UPPER = {"weight": 1.0, "z": 1.0, "y": 1.0, "xi": 0.25, "z_y": 1.0, "xi_zz": 0.25}


def random_state(model: SigmoidBeliefNetwork, rng: np.random.Generator, scale: float = 1.0) -> None:
    """Put the model in a non-trivial public state: random means, covariances, biases."""
    J, K = model.n_visible, model.n_latent
    st = model.state()
    A = rng.normal(size=(J, K + 1, K + 1))
    joint = 50.0 * np.einsum("jkl,jml->jkm", A, A) / (K + 1) + np.eye(K + 1)
    h = scale * rng.normal(size=(J, K + 1)) * 50.0
    st["w_stat"], st["wc_stat"], st["c_prec"] = joint[:, :K, :K], joint[:, :K, K], joint[:, K, K]
    st["w_h"], st["c_h"] = h[:, :K], h[:, K]
    st["b_h"], st["b_prec"] = rng.normal(size=K), rng.uniform(0.5, 2.0, K)
    model.load_state(st)


def moments(model: SigmoidBeliefNetwork):
    """Mean (J, K + 1) and second moment (J, K + 1, K + 1) of the joint q(w_j, c_j), rebuilt from
    the state's natural parameters (without noise the projection is the identity), and E[b]."""
    K = model.n_latent
    st = model.state()
    P = np.zeros((model.n_visible, K + 1, K + 1))
    P[:, :K, :K], P[:, :K, K], P[:, K, K] = st["w_stat"], st["wc_stat"], st["c_prec"]
    P[:, K, :K] = st["wc_stat"]
    P[:, np.arange(K), np.arange(K)] += st["w_prior"]
    P[:, K, K] += 1.0 / model.nu_c
    Sig = np.linalg.inv(P)
    mu = np.einsum("jkl,jl->jk", Sig, np.hstack([st["w_h"], st["c_h"][:, None]]))
    return mu, Sig + mu[:, :, None] * mu[:, None, :], model._mu_b


def augment(z: np.ndarray) -> np.ndarray:
    """zt = (z, 1): c_j is the weight of a constant latent unit."""
    return np.hstack([z, np.ones((len(z), 1))])


def brute_round(model: SigmoidBeliefNetwork, y: np.ndarray, pi: np.ndarray):
    """One E-step round by enumerating z in {0,1}^K: E[psi^2] under q(z) q(theta), then
    d_k = E_{q(z_-k)}[L(z_k = 1) - L(z_k = 0)] for the expected augmented log joint L."""
    mu, M, mub = moments(model)
    K = model.n_latent
    zs = np.array(list(itertools.product([0.0, 1.0], repeat=K)))
    qz = np.prod(np.where(zs > 0, pi, 1 - pi), axis=1)
    e_psi2 = np.einsum("zk,jkl,zl->zj", augment(zs), M, augment(zs))  # (2^K, J)
    xi = pg_mean(np.sqrt(qz @ e_psi2))

    def L(z):
        zt = augment(z)
        return ((y - 0.5) * (zt @ mu.T)).sum(-1) - 0.5 * (xi * np.einsum("zk,jkl,zl->zj", zt, M, zt)).sum(-1) \
            + ((z - 0.5) * mub).sum(-1)

    d = np.zeros(K)
    for k in range(K):
        on, off = zs.copy(), zs.copy()
        on[:, k], off[:, k] = 1.0, 0.0
        weight = np.prod(np.where(np.delete(zs, k, 1) > 0, np.delete(pi, k), 1 - np.delete(pi, k)), axis=1)
        weight = weight / 2.0  # each z_-k configuration appears twice in zs (z_k = 0, 1)
        d[k] = weight @ (L(on) - L(off))
    return expit(d), xi


@pytest.mark.parametrize("iterations", [1, 3])
def test_e_step_matches_brute_force_enumeration(iterations):
    rng = np.random.default_rng(1)
    model = SigmoidBeliefNetwork(5, 3, 100, inner_iterations=iterations, seed=2, damping=1.0)
    random_state(model, rng)
    Y = (rng.random((4, 5)) < 0.5).astype(float)
    pi, xi = model._e_step(Y)
    for n in range(4):
        p = expit(model._mu_b)
        for _ in range(iterations):
            p, x = brute_round(model, Y[n], p)
        np.testing.assert_allclose(pi[n], p, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(xi[n], x, rtol=1e-10, atol=1e-12)


def test_single_latent_unit_posterior_is_exact_given_omega():
    """K = 1: mean field is exact, so q(z = 1) equals the normalised augmented joint."""
    rng = np.random.default_rng(3)
    model = SigmoidBeliefNetwork(6, 1, 100, inner_iterations=2, seed=0, damping=1.0)
    random_state(model, rng)
    y = (rng.random(6) < 0.5).astype(float)
    pi, xi = model._e_step(y[None])
    mu, M, mub = moments(model)
    logj = []
    for z in (0.0, 1.0):
        zt = augment(np.array([[z]]))
        logj.append(float(((y - 0.5) * (zt @ mu.T)).sum() - 0.5 * (xi[0] * np.einsum(
            "zk,jkl,zl->zj", zt, M, zt)[0]).sum() + (z - 0.5) * mub[0]))
    assert pi[0, 0] == pytest.approx(expit(logj[1] - logj[0]), rel=1e-12)


def per_record_norms(model, Y):
    out = {b.name: [] for b in model.blocks()}
    for row in Y:
        s = model.clipped_sum({"y": row[None]})
        for k, v in s.items():
            out[k].append(np.linalg.norm(v))
    return {k: np.array(v) for k, v in out.items()}


def scaled_record(model, row):
    """One record's contribution, each block scaled by a_k / C_k (the engine's allocation), concatenated."""
    w = model.default_block_weights()
    s = model.clipped_sum({"y": row[None]})
    return np.concatenate([s[b.name].ravel() * w[b.name] / b.bound for b in model.blocks()])


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("fractions", [(1.0, 1.0, 1.0), (0.2, 0.3, 0.25)])
def test_per_record_bounds_hold_on_adversarial_inputs(dtype, fractions):
    """Every block of every record stays within its bound, entries in [0, upper], whatever the
    state (tiny to extreme weights) or the E-step returns (NaN, inf, out of range); so the scaled
    concatenations have norm <= 1 and any two differ by at most the claimed diameter sqrt(2)."""
    rng = np.random.default_rng(4)
    J, K = 7, 4
    u, o, p = fractions
    model = SigmoidBeliefNetwork(J, K, 100, seed=1, dtype=dtype, clip_units=u, clip_omega=o, clip_pixels=p)
    bounds = {b.name: b.bound for b in model.blocks()}
    if fractions == (1.0, 1.0, 1.0):  # the box bounds of the uncentred entries: never binding
        assert bounds == pytest.approx({"weight": 1.0, "z": math.sqrt(K), "y": math.sqrt(J), "xi": math.sqrt(J) / 4,
                                        "z_y": math.sqrt(J * K), "xi_zz": math.sqrt(J * K * (K + 1) / 2) / 4})
    Y = np.vstack([np.zeros(J), np.ones(J), rng.integers(0, 2, (20, J))]).astype(np.uint8)
    rows = []
    for scale in (0.0, 1.0, 1e3):  # tiny, moderate and extreme weights
        random_state(model, rng, scale)
        for k, norms in per_record_norms(model, Y).items():
            assert norms.max() <= bounds[k], (k, scale)  # exact: the clip factor keeps a 1e-9 margin
        rows += [scaled_record(model, row) for row in Y]
    # whatever the E-step returns (NaN, inf, out of range), the clipped statistics stay bounded
    garbage = np.array([[np.nan, np.inf, -5.0, 7.0]]), np.array([[np.nan, -np.inf, 9.0, -1.0, 0.3, 0.25, np.inf]])
    model._e_step = lambda y: (np.repeat(garbage[0], len(y), 0), np.repeat(garbage[1], len(y), 0))
    raw = np.array([[np.nan, 5.0, -3.0, 1.0, 0.0, 0.7, 2.0]])
    for k, norms in per_record_norms(model, raw).items():
        assert norms.max() <= bounds[k], k
    rows.append(scaled_record(model, raw[0]))
    U = np.array(rows)
    assert U.min() >= 0.0 and np.linalg.norm(U, axis=1).max() <= 1.0
    gram = U @ U.T
    dist2 = np.diag(gram)[:, None] + np.diag(gram)[None, :] - 2 * gram
    assert dist2.max() <= 2.0 * (1 + 1e-9)
    for name, upper in UPPER.items():  # every entry of one record's sums in its known range
        sums = model.clipped_sum({"y": Y[:1]})[name]
        assert 0.0 <= sums.min() and sums.max() <= upper


def test_clipping_down_weights_a_record_without_distorting_it():
    """Tight fractions scale a record's blocks by one factor f (the weight block), so every block
    is the unclipped one times f; with fractions 1 no record is ever clipped (f = 1)."""
    rng = np.random.default_rng(8)
    J, K = 12, 5
    Y = (rng.random((30, J)) < 0.4).astype(np.uint8)
    free = SigmoidBeliefNetwork(J, K, 100, seed=1, clip_units=1.0, clip_omega=1.0, clip_pixels=1.0)
    tight = SigmoidBeliefNetwork(J, K, 100, seed=1, clip_units=0.1, clip_omega=0.5, clip_pixels=0.2)
    random_state(free, rng)
    tight.load_state(free.state())
    weights = []
    for row in Y:
        a, b = free.clipped_sum({"y": row[None]}), tight.clipped_sum({"y": row[None]})
        assert a["weight"][0] == 1.0
        f = b["weight"][0]
        for name in a:
            np.testing.assert_allclose(b[name], f * a[name], rtol=1e-12, atol=1e-15)
        weights.append(f)
    assert min(weights) < 0.9  # the tight rule does bind on these records
    assert free.clipped_sum({"y": Y})["weight"][0] == len(Y)


def test_engine_uses_diameter_sqrt2_and_sqrt_bound_weights():
    model = SigmoidBeliefNetwork(9, 3, 100)
    w = model.default_block_weights()
    assert sum(v * v for v in w.values()) == pytest.approx(1.0)
    bounds = {b.name: b.bound for b in model.blocks()}
    assert w["xi_zz"] / w["y"] == pytest.approx(math.sqrt(bounds["xi_zz"] / bounds["y"]))
    assert model.diameter(w) == model.diameter() == math.sqrt(2) and set(UPPER) == set(bounds)
    assert {k: getattr(model, k) for k in RULE_CLIP} == RULE_CLIP  # the public rule is the default
    with pytest.raises(ValueError, match="clip_units"):
        SigmoidBeliefNetwork(9, 3, 100, clip_units=1.5)


def true_sbn():
    J, K = 16, 2
    W = np.zeros((J, K))
    W[:8, 0], W[8:, 1] = 4.0, 4.0
    return W, np.full(J, -2.0), np.array([0.0, 0.5])


def sample_sbn(rng, n, W, c, b):
    z = (rng.random((n, len(b))) < expit(b)).astype(float)
    return (rng.random((n, len(c))) < expit(z @ W.T + c)).astype(np.uint8)


def exact_loglik(W, c, b, Y):
    """Mean log p(y) of an SBN with parameters (W, c, b), summing z exactly."""
    K = len(b)
    zs = np.array(list(itertools.product([0.0, 1.0], repeat=K)))
    lp = np.log(expit(np.where(zs > 0, 1.0, -1.0) * b)).sum(1)
    psi = zs @ W.T + c
    ll = Y @ np.log(expit(psi)).T + (1 - Y) @ np.log(expit(-psi)).T + lp
    mx = ll.max(1, keepdims=True)
    return float(np.mean(mx[:, 0] + np.log(np.exp(ll - mx).sum(1))))


def test_m_step_recovers_a_known_sbn_without_noise():
    """Non-private stochastic VB on 6,000 draws from a 2-unit SBN with strong weights: the learned
    means give nearly the true held-out log-likelihood (exact, z enumerated), and the weights match
    the truth up to the SBN's symmetries (unit permutation; z -> 1 - z flips W's column sign)."""
    rng = np.random.default_rng(0)
    W, c, b = true_sbn()
    N, S = 6000, 500
    Y = sample_sbn(rng, N, W, c, b)
    model = SigmoidBeliefNetwork(16, 2, N, seed=1)
    for t in range(400):
        idx = rng.choice(N, S, replace=False)
        sums = model.clipped_sum({"y": Y[idx]})
        model.update({k: v / S for k, v in sums.items()}, (1.0 + t) ** -0.7)
    Yt = sample_sbn(rng, 4000, W, c, b).astype(float)
    ll_true = exact_loglik(W, c, b, Yt)
    ll_fit = exact_loglik(model.weights, model.visible_bias, model.latent_bias, Yt)
    # ~7 nats per image; an independent-pixel model is ~4 nats worse here, chance ~11 worse
    assert ll_fit > ll_true - 0.1
    best = min(np.abs(np.abs(model.weights[:, list(p)]) - W).max() for p in itertools.permutations(range(2)))
    assert best < 0.8  # shrinkage prior and VB: |W| a little below 4, off-block weights near 0
    assert pixel_accuracy(Yt, model.reconstruct_proba(Yt)) > 0.87
    # and the same statistics through float32 give the same sums to single precision
    m32 = SigmoidBeliefNetwork(16, 2, N, seed=1, dtype="float32")
    m32.load_state(model.state())
    s64, s32 = model.clipped_sum({"y": Y[:500]}), m32.clipped_sum({"y": Y[:500]})
    for k in s64:
        np.testing.assert_allclose(s32[k], s64[k], atol=1e-4 * max(1.0, np.abs(s64[k]).max()))


def test_parse_batch_forms_and_rejections():
    model = SigmoidBeliefNetwork(10, 2, 50)
    bits = [1, 0, 1, 1, 0, 0, 0, 1, 1, 1]
    packed = np.packbits(np.array(bits, dtype=np.uint8)).tobytes().hex()
    parsed = model.parse_batch([{"y": bits}, {"y": packed}, {"y": bits[:9]}, {"y": "zz"}, {"y": packed + "00"},
                                {"y": [2] + bits[1:]}, {"y": True}, [1], {"y": "b1c1"}])
    assert parsed.accepted.tolist() == [0, 1]
    assert parsed.rows["y"].tolist() == [bits, bits] and parsed.rows["y"].dtype == np.uint8
    assert [r[1] for r in parsed.rejected] == ["wrong_shape", "out_of_range", "out_of_range", "out_of_range",
                                               "wrong_type", "not_object", "out_of_range"]


def test_state_checkpoint_and_message_round_trip():
    rng = np.random.default_rng(6)
    W, c, b = true_sbn()
    Y = sample_sbn(rng, 600, W, c, b)
    records = [{"y": row.tolist()} for row in Y]
    kw = dict(n_visible=16, n_latent=2, dataset_size=300, reservoir=300, batch_size=100, every_records=100,
              epsilon=2.0, delta=1e-5, planned_steps=10, seed=3)
    learner = PrivateLearner("sbn", **kw).learn_many(records)
    assert learner.epsilon_spent > 0 and learner.engine.diameter == math.sqrt(2)
    # model message: schema-valid, and the reader's model predicts exactly like the learner's
    msg = learner.message()
    read = posterior_from_message(msg).model
    np.testing.assert_array_equal(read.reconstruct_proba(Y[:20]), learner.model.reconstruct_proba(Y[:20]))
    # checkpoint: a new learner restored from the state continues identically
    other = PrivateLearner("sbn", ledger=learner.ledger, **kw)
    other.load_state(learner.state())
    for k, v in learner.model.state().items():
        np.testing.assert_array_equal(other.model.state()[k], v)
    with pytest.raises(ValueError, match="'w_h' must have shape"):
        read.load_state({**read.state(), "w_h": np.zeros((3, 3))})
    with pytest.raises(ValueError, match="no 'noise_var'"):
        read.load_state({k: v for k, v in read.state().items() if k != "noise_var"})
    with pytest.raises(ValueError, match="rho"):
        read.update({bl.name: np.zeros(bl.shape) for bl in read.blocks()}, 0.0)
    with pytest.raises(ValueError, match="dtype"):
        SigmoidBeliefNetwork(4, 2, 10, dtype="float16")


def test_state_with_noise_driven_negative_statistics_round_trips():
    """Under noise the released xi mean of a pixel can be negative (its blend ``c_prec`` too: on
    400 images at epsilon 1, entries near -30 were seen); the model uses it as released and the
    eigenvalue floor keeps the precision valid, so its own state, checkpoint and message must load
    (they were refused after the budget was spent)."""
    model = SigmoidBeliefNetwork(n_visible=6, n_latent=2, dataset_size=400, seed=0)
    model.set_noise_scale({"xi_zz": 0.05})
    means = {bl.name: np.full(bl.shape, 0.02) for bl in model.blocks()}
    means["xi"] = np.array([-0.03, 0.01, -0.2, 0.05, 0.0, 0.02])  # noise took three below 0
    model.update(means, rho=1.0)
    state = model.state()
    assert np.any(state["c_prec"] < 0)
    other = SigmoidBeliefNetwork(n_visible=6, n_latent=2, dataset_size=400, seed=1)
    other.load_state(state)
    Y = np.array([[1, 0, 1, 0, 0, 1], [0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(other.reconstruct_proba(Y), model.reconstruct_proba(Y))
    with pytest.raises(ValueError, match="TPBN rates must be positive"):
        other.load_state({**state, "phi_rate": -state["phi_rate"]})


def test_public_start_does_not_switch_units_off():
    """At the public start q(w_jk) has variance ~init_scale^2, so the E-step's -E[w_jk^2] E[omega]/2
    terms (summed over J = 784 pixels) stay small and q(z | y) is not pinned at 0 for every image
    (with unit variance they sum to about -J/8 = -98 and W = 0 is a fixed point without noise)."""
    rng = np.random.default_rng(4)
    model = SigmoidBeliefNetwork(784, 10, 60_000, seed=0)
    pi = model.posterior_z((rng.random((50, 784)) < 0.2).astype(float))
    # d_nk starts near -J E[omega] 2 init_scale^2 / 2 = -2 (pi ~ 0.12), not near -98 (pi ~ 1e-43)
    assert 0.05 < pi.mean() < 0.5 and np.mean(pi < 1e-3) < 0.01


def test_noisy_updates_stay_bounded():
    """Heavy noise on every block (z = 2 at S = 100, as a private run at a small batch gets it):
    the joint q(w_j, c_j) update with the eigenvalue floor keeps E[W] and E[c] bounded; the
    alternating q(c)/q(W) updates diverged on this very stream (|E[c]| about 1e7 after 40 steps)."""
    rng = np.random.default_rng(5)
    truth = np.random.default_rng(1234)
    J, K, S, z = 64, 4, 100, 2.0
    W = np.where(truth.random((J, K)) < 0.3, truth.normal(0.0, 3.0, (J, K)), 0.0)
    Y = sample_sbn(rng, 4000, W, np.full(J, -2.0), np.full(K, -1.0))
    model = SigmoidBeliefNetwork(J, K, 60_000, seed=0)
    blocks = model.blocks()
    w = model.default_block_weights()
    stds = {bl.name: z * bl.bound / w[bl.name] for bl in blocks}
    model.set_noise_scale({k: v / S for k, v in stds.items()})
    for t in range(40):
        sums = model.clipped_sum({"y": Y[rng.choice(len(Y), S, replace=False)]})
        model.update({bl.name: (sums[bl.name] + stds[bl.name] * rng.standard_normal(bl.shape)) / S
                      for bl in blocks}, (1.0 + t) ** -0.5)
        assert np.abs(model.visible_bias).max() < 20 and np.abs(model.weights).max() < 20
    assert model.eigen_floor > 0


def test_fit_rule_uses_public_quantities_and_gives_reasons():
    private = fit_rule(60_000, 784, 1.0, 1e-4)
    assert private == fit_rule(60_000, 784, 1.0, 1e-4)  # deterministic, no data
    assert private["steps"] == 20 and private["batch_size"] * private["steps"] <= 60_000
    assert private["q"] == pytest.approx(private["batch_size"] / 60_000)
    non_private = fit_rule(60_000, 784, None, 1e-4)
    assert non_private["batch_size"] == 400 and non_private["steps"] == 150
    assert (private["tau0"], private["kappa"], non_private["kappa"]) == (1.0, 1.0, 0.51)
    grid = fit_rule(60_000, 784, 0.95, 1e-4, n_latent=100, batch_size=3200)
    assert (grid["batch_size"], grid["steps"], grid["model_params"]["n_latent"]) == (3200, 18, 100)
    for rule in (private, non_private, grid):
        assert all(isinstance(v, str) and v for v in rule["why"].values())
        assert {"batch_size", "steps", "kappa", "tau0", "n_latent", "inner_iterations"} <= set(rule["why"])
        SigmoidBeliefNetwork(784, **rule["model_params"])  # the constructor accepts the rule's parameters
    assert fit_rule(10, 784, 1.0, 1e-4, batch_size=400)["batch_size"] == 10
    with pytest.raises(ValueError, match="epsilon"):
        fit_rule(1000, 10, 0.0, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        fit_rule(1000, 10, 1.0, 1.5)
    with pytest.raises(ValueError, match="n"):
        fit_rule(0, 10, 1.0, 1e-5)


def test_state_with_separate_bias_factor_loads_exactly():
    """A checkpoint of the earlier layout (q(c) apart from q(W)) loads into the joint q(w_j, c_j)
    with the same means: the block-diagonal joint precision changes nothing (the demo's
    true-network reference builds its model this way)."""
    W, c, b = true_sbn()
    J, K = W.shape
    model = SigmoidBeliefNetwork(J, K, 1)
    old = {k: v for k, v in model.state().items() if k != "wc_stat"}
    old.update(w_h=W * 1e6, w_stat=np.broadcast_to(1e6 * np.eye(K), (J, K, K)).copy(),
               c_h=c * 1e6, c_prec=np.full(J, 1e6), b_h=b * 1e6, b_prec=np.full(K, 1e6))
    model.load_state(old)
    np.testing.assert_allclose(model.weights, W, atol=1e-5)
    np.testing.assert_allclose(model.visible_bias, c, atol=1e-5)
    np.testing.assert_allclose(model.latent_bias, b, atol=1e-5)
    with pytest.raises(ValueError, match="'c_h' must have shape"):
        model.load_state({**old, "c_h": np.zeros(J + 1)})


def test_damped_e_step_is_the_average_step_and_keeps_fixed_points():
    """One damped round is the average of the old q(z) and the undamped round; run long enough,
    damped and undamped rounds reach the same fixed point (on a weakly coupled model)."""
    rng = np.random.default_rng(7)
    Y = (rng.random((6, 5)) < 0.5).astype(float)
    one = {}
    for lam in (1.0, 0.5):
        model = SigmoidBeliefNetwork(5, 3, 100, inner_iterations=1, seed=2, damping=lam)
        random_state(model, np.random.default_rng(1), scale=0.1)
        one[lam] = model._e_step(Y)[0]
    start = expit(model.latent_bias)
    np.testing.assert_allclose(one[0.5], 0.5 * start + 0.5 * one[1.0], rtol=1e-12)
    long = {}
    for lam in (1.0, 0.5):
        model = SigmoidBeliefNetwork(5, 3, 100, inner_iterations=200, seed=2, damping=lam)
        random_state(model, np.random.default_rng(1), scale=0.1)
        long[lam] = model._e_step(Y)[0]
    np.testing.assert_allclose(long[0.5], long[1.0], atol=1e-9)
    with pytest.raises(ValueError, match="damping"):
        SigmoidBeliefNetwork(5, 3, 100, damping=1.5)


def test_noisy_means_enter_the_m_step_unprojected():
    """The M-step's linear statistics take the noisy means as released: antithetic noise +e / -e
    averages back to the noiseless natural parameters exactly (a projection onto [0, upper] would
    bias the many entries near 0 upwards and break this)."""
    rng = np.random.default_rng(9)
    J, K = 10, 3
    Y = (rng.random((50, J)) < 0.2).astype(np.uint8)
    model = SigmoidBeliefNetwork(J, K, 1000, seed=0)
    means = {k: v / len(Y) for k, v in model.clipped_sum({"y": Y}).items()}
    noise = {k: 0.3 * rng.standard_normal(v.shape) for k, v in means.items()}
    states = []
    for sign in (0.0, 1.0, -1.0):
        m = SigmoidBeliefNetwork(J, K, 1000, seed=0)
        m.update({k: v + sign * noise[k] for k, v in means.items()}, rho=1.0)
        states.append(m.state())
    for name in ("w_h", "c_h", "w_stat", "wc_stat", "c_prec"):
        np.testing.assert_allclose((states[1][name] + states[2][name]) / 2, states[0][name], rtol=1e-10, atol=1e-8)


def _sums_close(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-9, atol=1e-12, err_msg=name)


def test_a_batch_longer_than_one_e_step_chunk_sums_every_chunk():
    from stream_vips.models.sbn import _E_STEP_ROWS

    rng = np.random.default_rng(4)
    model = SigmoidBeliefNetwork(6, 3, 100, seed=3, clip_units=0.3, clip_omega=0.5, clip_pixels=0.4)
    random_state(model, rng)
    Y = (rng.random((2 * _E_STEP_ROWS + 300, 6)) < 0.4).astype(np.float64)
    whole = model.clipped_sum({"y": Y})
    parts = [model.clipped_sum({"y": Y[i:i + 500]}) for i in range(0, len(Y), 500)]
    _sums_close(whole, {name: sum(p[name] for p in parts) for name in whole})
    assert whole["weight"][0] > _E_STEP_ROWS  # every row counted, each with a factor in (0, 1]


@pytest.mark.parametrize("shape", [(4, 7), (4, 5), (24,), (4, 6, 1)])
def test_a_batch_of_the_wrong_shape_is_refused_behind_the_wall(shape):
    model = SigmoidBeliefNetwork(6, 3, 100, seed=3)
    with pytest.raises(ValueError, match=r"batch must hold y of shape \(n, 6\)"):
        model.clipped_sum({"y": np.zeros(shape)})


def test_pixels_are_binarised_as_the_read_side_binarises_them():
    # Rows come from the reservoir as bits; a corrupt one (NaN, 0.5) reads as the read side reads it.
    model = SigmoidBeliefNetwork(6, 3, 100, seed=3)
    Y = np.array([[np.nan, 0.5, 1.0, 0.0, 0.7, 0.5], [0.5, np.nan, 0.0, 1.0, np.nan, 0.2]])
    _sums_close(model.clipped_sum({"y": Y}), model.clipped_sum({"y": model._binary(Y)}))
    assert model._binary(Y).tolist() == [[0, 0, 1, 0, 1, 0], [0, 0, 0, 1, 0, 0]]


def test_e_step_moments_are_kept_in_their_ranges_and_nan_reads_as_zero(monkeypatch):
    # q(z) means lie in [0, 1] and E[omega] in [0, 1/4]; whatever the E-step returns (overflow, a
    # corrupt state), the statistics use it clipped there, NaN as 0, so the bounds hold.
    model = SigmoidBeliefNetwork(4, 2, 100, seed=3, clip_units=1.0, clip_omega=1.0, clip_pixels=1.0)
    raw_pi = np.array([[np.nan, 1.5], [-0.5, 0.3]])
    raw_xi = np.array([[np.nan, 2.0, -1.0, 0.1], [0.3, np.nan, 0.25, -0.2]])
    monkeypatch.setattr(model, "_e_step", lambda y: (raw_pi.copy(), raw_xi.copy()))
    Y = np.array([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 1.0, 0.0]])
    got = model.clipped_sum({"y": Y})
    pi, xi = np.array([[0.0, 1.0], [0.0, 0.3]]), np.array([[0.0, 0.25, 0.0, 0.1], [0.25, 0.0, 0.25, 0.0]])
    monkeypatch.setattr(model, "_e_step", lambda y: (pi.copy(), xi.copy()))
    _sums_close(got, model.clipped_sum({"y": Y}))
    np.testing.assert_allclose(got["z"], pi.sum(axis=0))  # the worst-case bounds: nothing was clipped
    np.testing.assert_allclose(got["xi"], xi.sum(axis=0))
