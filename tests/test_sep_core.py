"""DP-SEP core: exactness on the conjugate model, noise and sensitivity of the release, clipping, PD.

Every step runs through the real engine (reservoir, sampler, budget monitor, MemoryLedger, PLD
accountant) so the model is tested against the contract it lives in.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler, PoissonSampler
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.sep.core import SITE, pack, packed_size, unpack
from stream_vips.models.sep.gaussian import GaussianMeanSEP
from stream_vips.models.sep.mixture import MixtureSEP
from stream_vips.models.sep.probit import ProbitSEP
from stream_vips.privacy.accountants import make_accountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import MemoryLedger


def make_engine(model, rows, sampler, z, *, steps=300, seed=0, tau0=1.0, kappa=1.0):
    """An engine over a full reservoir holding ``rows``; private ones have budget for ``steps``."""
    M = len(next(iter(rows.values())))
    res = Reservoir(model.row_layout(), capacity=M, rng=np.random.default_rng(seed))
    res.add_batch(rows)
    private = z > 0
    monitor = None
    if private:
        acct = make_accountant("auto", sampler.name)  # fixed-size: autodp RDP, Poisson: PLD
        event = SubsampledGaussianEvent(z, sampler.rate(M), sampler.name, count=steps)
        monitor = BudgetMonitor(acct.epsilon([event], 1e-5) * 1.001, 1e-5, acct, MemoryLedger())
    return PrivateEngine(
        model, res, sampler, monitor, z, np.random.default_rng(seed + 1), tau0, kappa, "pld",
        seeded=True, non_private=not private,
    )


class Spy:
    """Records, per update, the released natural parameters and their noise-free counterpart.

    With a batch of the whole reservoir (S = M) the batch is the whole reservoir, so the noise-free release is
    computable from the same state: residual = released - noise-free is exactly the engine's noise mapped
    through the public affine map (R).
    """

    def __init__(self, model, rows, normaliser):
        self.model, self.rows, self.normaliser = model, rows, normaliser
        self.released, self.clean, self.rhos = [], [], []
        release = model.release

        def spy_release(noisy_mean, rho):
            clean_mean = {SITE: model.clipped_sum(rows)[SITE] / normaliser}
            self.clean.append(release(clean_mean, rho))
            out = release(noisy_mean, rho)
            self.released.append(out)
            self.rhos.append(rho)
            return out

        model.release = spy_release


def gaussian_data(n, d, seed):
    rng = np.random.default_rng(seed)
    return rng.normal([1.0, -2.0, 0.5][:d], 1.5, size=(n, d))


def exact_posterior(x, noise_var, prior_var, prior_mean=0.0):
    n, d = x.shape
    prec = 1 / prior_var + n / noise_var
    mean = (prior_mean / prior_var + x.sum(0) / noise_var) / prec
    return mean, np.eye(d) / prec


def test_pack_is_an_isometry_and_inverts():
    rng = np.random.default_rng(0)
    eta = rng.normal(size=(5, 3, 4))
    A = rng.normal(size=(5, 3, 4, 4))
    prec = A + np.swapaxes(A, -1, -2)
    v = pack(eta, prec)
    assert v.shape == (5, packed_size(3, 4))
    expected = np.sqrt((eta**2).sum((1, 2)) + (prec**2).sum((1, 2, 3)))
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), expected, rtol=1e-12)
    e2, p2 = unpack(v, 3, 4)
    np.testing.assert_allclose(e2, eta, atol=1e-12)
    np.testing.assert_allclose(p2, prec, atol=1e-12)


def test_full_batch_sep_is_exact_on_the_conjugate_model():
    x = gaussian_data(200, 3, 1)
    model = GaussianMeanSEP(dim=3, dataset_size=200, clip=None, noise_var=2.0, prior_var=3.0)
    eng = make_engine(model, {"x": x}, FixedSizeSampler(200), 0.0)
    eng.step()  # rho_0 = 1: the averaged site becomes the mean likelihood term
    mean, cov = model.posterior()
    m_exact, c_exact = exact_posterior(x, 2.0, 3.0)
    np.testing.assert_allclose(mean[0], m_exact, rtol=1e-10)
    np.testing.assert_allclose(cov[0], c_exact, rtol=1e-10)


def test_minibatch_sep_converges_to_the_exact_posterior():
    # rho_t = 1 / (1 + t) makes theta_f the plain average of T fixed-size batch means.
    M, S, T, d, s2, p2 = 300, 30, 400, 3, 2.0, 3.0
    x = gaussian_data(M, d, 2)
    model = GaussianMeanSEP(dim=d, dataset_size=M, clip=None, noise_var=s2, prior_var=p2)
    eng = make_engine(model, {"x": x}, FixedSizeSampler(S), 0.0, tau0=1.0, kappa=1.0)
    for _ in range(T):
        eng.step()
    mean, cov = model.posterior()
    m_exact, c_exact = exact_posterior(x, s2, p2)
    np.testing.assert_allclose(cov[0], c_exact, rtol=1e-9)  # the precision site is constant
    # Error of the mean: N * (average of T batch means of x / s2 - full mean) / posterior precision.
    var_batch_mean = x.var(axis=0) / S * (M - S) / (M - 1)
    sd = M * np.sqrt(var_batch_mean / T) / s2 / (1 / p2 + M / s2)
    assert np.all(np.abs(mean[0] - m_exact) < 5 * sd), (mean[0] - m_exact) / sd
    assert np.any(np.abs(mean[0] - m_exact) > 0.01 * sd)  # it is stochastic, not a shortcut


@pytest.mark.parametrize("z", [0.7, 3.0])
def test_noise_std_per_released_natural_parameter_is_z_times_the_bound(z):
    M, d, C = 50, 3, 2.0
    x = gaussian_data(M, d, 3)
    model = GaussianMeanSEP(dim=d, dataset_size=M, clip=C, noise_var=2.0)
    eng = make_engine(model, {"x": x}, FixedSizeSampler(M), z, tau0=10.0, kappa=0.7)
    spy = Spy(model, eng.reservoir.columns, eng.normaliser)
    T = 300
    for _ in range(T):
        assert eng.step() is not None
    events = eng.monitor.ledger.events()
    assert len(events) == T == len(spy.released)  # every step is ledgered and released
    assert all(e.noise_multiplier == z and e.diameter == 2.0 for e in events)
    bounds = np.array([model.release_bound(r, eng.normaliser) for r in spy.rhos])
    np.testing.assert_allclose(bounds, [M * min(1.0, r) * C / M for r in spy.rhos])
    resid = (np.array(spy.released) - np.array(spy.clean)) / (z * bounds[:, None])
    n = resid.size
    assert abs(resid.mean()) < 5 / math.sqrt(n)
    assert abs(resid.std() - 1.0) < 5 / math.sqrt(2 * n)
    # In matrix form: std z * C_rel on eta and the precision diagonal, z * C_rel / sqrt(2) off it.
    eta_r, prec_r = unpack(resid, 1, d)
    off = prec_r[:, 0][:, ~np.eye(d, dtype=bool)]
    diag = np.diagonal(prec_r[:, 0], axis1=1, axis2=2)
    assert abs(eta_r.std() - 1.0) < 5 / math.sqrt(2 * eta_r.size)
    assert abs(diag.std() - 1.0) < 5 / math.sqrt(2 * diag.size)
    assert abs(off.std() * math.sqrt(2) - 1.0) < 5 / math.sqrt(off.size)  # pairs are copies


def test_release_bound_reduces_to_the_papers_sensitivity():
    # Paper (Proposition 1): one record at a time (Z = S = 1), theta_new = theta_0 +
    # (N - gamma/N) theta_f + (gamma/N) theta_fn, i.e. s = gamma / N^2: Delta = 2 gamma C / N.
    N, C, gamma = 1000, 1.5, 1.0
    model = GaussianMeanSEP(dim=2, dataset_size=N, clip=C)
    assert 2 * model.release_bound(gamma / N**2, 1.0) == pytest.approx(2 * gamma * C / N, rel=1e-12)
    # Streaming form: Z = q M, step s = gamma rho.
    m2 = GaussianMeanSEP(dim=2, dataset_size=N, clip=C, damping=0.5)
    assert m2.release_bound(0.1, 50.0) == pytest.approx(N * 0.05 * C / 50.0)


def _families(C):
    return [
        (GaussianMeanSEP(dim=3, dataset_size=40, clip=C, noise_var=0.5), lambda r, n: {"x": r.normal(0, 3, (n, 3))}),
        (MixtureSEP(n_components=3, dim=2, dataset_size=40, clip=C, noise_sd=0.5, init_seed=3),
         lambda r, n: {"x": r.normal(0, 2, (n, 2))}),
        (ProbitSEP(dim=3, dataset_size=40, clip=C, intercept=False),
         lambda r, n: {"x": r.normal(0, 3, (n, 3)), "y": r.integers(0, 2, n).astype(np.int8)}),
        (MixtureSEP(n_components=3, dim=2, dataset_size=40, clip=C, noise_sd=0.5, init_seed=3, mean_covariance="diag"),
         lambda r, n: {"x": r.normal(0, 2, (n, 2))}),
        (MixtureSEP(n_components=3, dim=3, dataset_size=40, clip=C, noise_sd=0.5, init_seed=3,
                    mean_covariance="spherical", learn_spreads=False),
         lambda r, n: {"x": r.normal(0, 2, (n, 3))}),
    ]


@pytest.mark.parametrize("idx", [0, 1, 2, 3, 4])
def test_one_record_moves_the_release_by_at_most_twice_the_bound(idx):
    C, rho, Z = 1.0, 0.3, 20.0
    model, draw = _families(C)[idx]
    rng = np.random.default_rng(idx)
    worst = 0.0
    for _ in range(50):
        batch = draw(rng, 20)
        other = {k: v.copy() for k, v in batch.items()}
        repl = draw(rng, 1)
        for k in other:
            other[k][7] = repl[k][0] * rng.choice([1.0, 30.0]) if k == "x" else repl[k][0]
        a = model.release({SITE: model.clipped_sum(batch)[SITE] / Z}, rho)
        b = model.release({SITE: model.clipped_sum(other)[SITE] / Z}, rho)
        worst = max(worst, np.linalg.norm(a - b) / model.release_bound(rho, Z))
    assert worst <= 2.0 + 1e-9
    assert worst > 0.5  # the bound is not vacuous: clipped sites reach norm C


@pytest.mark.parametrize("idx", [0, 1, 2, 3, 4])
def test_every_local_update_and_every_site_is_clipped(idx):
    C = 0.8
    model, draw = _families(C)[idx]
    rng = np.random.default_rng(10 + idx)
    rows = draw(rng, 40)
    eng = make_engine(model, rows, FixedSizeSampler(20), 5.0, steps=30, seed=idx, tau0=2.0, kappa=0.6)
    hit = 0
    for _ in range(30):
        for i in range(len(rows["x"])):
            single = {k: v[i : i + 1] for k, v in rows.items()}
            norm = np.linalg.norm(model.clipped_sum(single)[SITE])
            assert norm <= C * (1 + 1e-12)
            hit += norm > C * (1 - 1e-9)
        total = model.clipped_sum(rows)[SITE]
        singles = sum(model.clipped_sum({k: v[i : i + 1] for k, v in rows.items()})[SITE]
                      for i in range(len(rows["x"])))
        np.testing.assert_allclose(total, singles, rtol=1e-9, atol=1e-9)
        eng.step()
        assert np.linalg.norm(model.site) <= C * (1 + 1e-12)
    assert hit > 0  # clipping was active


@pytest.mark.parametrize("idx", [0, 1, 2, 3, 4])
def test_published_precision_is_always_positive_definite(idx):
    # Tiny N and huge noise: the released precision is often indefinite before projection.
    model, draw = _families(4.0)[idx]
    rng = np.random.default_rng(20 + idx)
    rows = draw(rng, 40)
    eng = make_engine(model, rows, PoissonSampler(0.25), 20.0, steps=60, seed=idx, tau0=1.0, kappa=0.6)
    spy = Spy(model, eng.reservoir.columns, eng.normaliser)
    for _ in range(60):
        eng.step()
        prec = model.state()["prec"]
        assert np.all(np.linalg.eigvalsh(prec) >= model.precision_floor * (1 - 1e-9))
        cavity = model.cavity()[1]  # the diagonals themselves with diagonal factors
        assert np.all((cavity if model.diagonal else np.linalg.eigvalsh(cavity)) > 0)
    released = unpack(np.array(spy.released), model.n_factors, model.dim, model.factor)[1]
    lowest = released.min() if model.diagonal else np.linalg.eigvalsh(released).min()
    assert lowest < 0  # the projection did real work


def test_plain_sep_cannot_run_privately_and_clipped_sep_runs_without_noise():
    x = gaussian_data(20, 2, 5)
    plain = GaussianMeanSEP(dim=2, dataset_size=20, clip=None)
    assert plain.blocks()[0].bound == math.inf
    with pytest.raises(ValueError):
        make_engine(plain, {"x": x}, PoissonSampler(0.5), 1.0, steps=1)
    clipped = GaussianMeanSEP(dim=2, dataset_size=20, clip=1.0)
    eng = make_engine(clipped, {"x": x}, PoissonSampler(0.5), 0.0)
    eng.step()
    assert np.linalg.norm(clipped.site) <= 1.0 + 1e-12


def test_state_round_trip_and_validation():
    model = MixtureSEP(n_components=2, dim=2, dataset_size=30, clip=5.0, init_seed=4)
    rows = {"x": np.random.default_rng(0).normal(0, 2, (30, 2))}
    eng = make_engine(model, rows, PoissonSampler(0.5), 3.0, steps=3)
    for _ in range(3):
        eng.step()
    other = MixtureSEP(n_components=2, dim=2, dataset_size=30, clip=5.0, init_seed=9)
    other.load_state(model.state())
    np.testing.assert_allclose(other.site, model.site, atol=1e-12)
    json.dumps(model.hyperparameters())
    with pytest.raises(ValueError, match="prec"):
        other.load_state({"eta": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="positive definite"):
        other.load_state({"eta": np.zeros((2, 2)), "prec": -np.stack([np.eye(2)] * 2)})


@pytest.mark.parametrize(
    "kwargs, key",
    [({"clip": -1.0}, "clip"), ({"dataset_size": 0}, "dataset_size"), ({"damping": 0}, "damping"),
     ({"prior_var": float("nan")}, "prior_var"), ({"prior_mean": [1.0]}, "prior_mean")],
)
def test_bad_configuration_names_the_key(kwargs, key):
    args = {"dim": 2, "dataset_size": 10, "clip": 1.0, **kwargs}
    with pytest.raises(ValueError, match=key):
        GaussianMeanSEP(**args)


def test_parse_batch_rejects_with_reasons_and_clips_x():
    model = GaussianMeanSEP(dim=2, dataset_size=10, clip=1.0, x_clip=1.0)
    parsed = model.parse_batch([{"x": [3.0, 4.0]}, {"x": [1.0]}, {"x": [float("nan"), 0.0]}, {"y": 1}, [1, 2]])
    assert parsed.accepted.tolist() == [0]
    np.testing.assert_allclose(parsed.rows["x"], [[0.6, 0.8]])
    assert [r[1] for r in parsed.rejected] == ["wrong_shape", "non_finite", "missing_field", "not_object"]


def test_eigen_floor_follows_the_public_noise_of_the_averaged_site():
    N, d, std = 100, 3, 0.2
    model = GaussianMeanSEP(dim=d, dataset_size=N, clip=None, floor_factor=1.5, prior_var=1.0)
    assert model.eigen_floor == 1.0  # before any noise: the prior precision
    model.set_noise_scale({SITE: std})
    rhos = [1.0, 0.5, 0.25, 0.2]
    x = gaussian_data(N, d, 7)
    for r in rhos:
        model.update({SITE: model.clipped_sum({"x": x})[SITE] / N}, r)
    # blending weights of the steps in the final site: w_t = s_t prod_{u > t} (1 - s_u)
    w = [r * np.prod([1 - u for u in rhos[i + 1 :]]) for i, r in enumerate(rhos)]
    expected = 1.5 * N * math.sqrt(d * np.sum(np.square(w)) * std**2)
    assert model.eigen_floor == pytest.approx(max(1.0, expected), rel=1e-12)
    assert np.all(np.linalg.eigvalsh(model.state()["prec"]) >= model.eigen_floor * (1 - 1e-9))
    with pytest.raises(ValueError, match="noise std"):
        model.set_noise_scale({SITE: -1.0})


def test_diagonal_factors_pack_their_diagonals_and_floor_each_entry_at_its_own_noise():
    rng = np.random.default_rng(5)
    eta, diag = rng.normal(size=(2, 3, 4)), rng.uniform(0.5, 2.0, (2, 3, 4))
    v = pack(eta, diag)
    assert v.shape == (2, packed_size(3, 4, factor="diag")) == (2, 24)
    # the packed norm is the norm of (eta, prec) with prec the diagonal matrices
    full = pack(eta, diag[..., :, None] * np.eye(4))
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), np.linalg.norm(full, axis=1), rtol=1e-12)
    back_eta, back_diag = unpack(v, 3, 4, factor="diag")
    np.testing.assert_array_equal(back_eta, eta)
    np.testing.assert_array_equal(back_diag, diag)
    N, std, d = 100, 0.2, 3
    model = MixtureSEP(n_components=2, dim=d, dataset_size=N, clip=1.0, mean_covariance="diag", floor_factor=1.5)
    model.set_noise_scale({SITE: std, "count": 0.0, "square": 0.0})
    x = {"x": rng.normal(size=(N, d))}
    sums = model.clipped_sum(x)
    model.update({k: v / N for k, v in sums.items()}, 0.5)
    # one step of weight s = 0.5: each diagonal entry of N theta_f has noise std N * 0.5 * std
    assert model.eigen_floor == pytest.approx(max(model.precision_floor, 1.5 * N * 0.5 * std), rel=1e-12)
    assert np.all(np.diagonal(model.state()["prec"], axis1=1, axis2=2) >= model.eigen_floor * (1 - 1e-12))


def test_isotropic_factors_pack_one_precision_and_floor_it_at_its_own_noise():
    rng = np.random.default_rng(6)
    eta, lam = rng.normal(size=(2, 3, 4)), rng.uniform(0.5, 2.0, (2, 3, 1))
    v = pack(eta, lam)
    assert v.shape == (2, packed_size(3, 4, factor="spherical")) == (2, 15)
    # the released coordinates are eta and the one lambda per factor: their norm is what is clipped
    np.testing.assert_allclose(np.linalg.norm(v, axis=1) ** 2, (eta**2).sum(axis=(1, 2)) + (lam**2).sum(axis=(1, 2)))
    back_eta, back_lam = unpack(v, 3, 4, factor="spherical")
    np.testing.assert_array_equal(back_eta, eta)
    np.testing.assert_array_equal(back_lam, lam)
    with pytest.raises(ValueError, match="factor"):
        packed_size(3, 4, factor="round")
    N, std, d = 100, 0.2, 3
    model = MixtureSEP(n_components=2, dim=d, dataset_size=N, clip=1.0, mean_covariance="spherical",
                       learn_spreads=False, floor_factor=1.5)
    model.set_noise_scale({SITE: std})
    sums = model.clipped_sum({"x": rng.normal(size=(N, d))})
    model.update({k: v / N for k, v in sums.items()}, 0.5)
    # one step of weight s = 0.5: the one precision entry of N theta_f has noise std N * 0.5 * std
    assert model.eigen_floor == pytest.approx(max(model.precision_floor, 1.5 * N * 0.5 * std), rel=1e-12)
    prec = model.state()["prec"]
    assert np.all(prec == np.diagonal(prec, axis1=1, axis2=2)[:, :1, None] * np.eye(d))
    assert np.all(np.diagonal(prec, axis1=1, axis2=2) >= model.eigen_floor * (1 - 1e-12))


@pytest.mark.parametrize("idx", [0, 1, 2, 3, 4])
def test_hyperparameters_rebuild_the_model_for_a_reader(idx):
    import inspect

    model, _ = _families(2.0)[idx]
    hp = json.loads(json.dumps(model.hyperparameters()))
    params = inspect.signature(type(model)).parameters
    rebuilt = type(model)(**{k: v for k, v in hp.items() if k in params})
    assert rebuilt.hyperparameters() == model.hyperparameters()
    rebuilt.load_state(model.state())
    np.testing.assert_allclose(rebuilt.site, model.site, atol=1e-12)


@pytest.mark.parametrize("idx", [0, 1, 2, 3, 4])
def test_an_empty_poisson_batch_still_releases(idx):
    model, draw = _families(1.0)[idx]
    empty = {k: v[:0] for k, v in draw(np.random.default_rng(0), 3).items()}
    sums = model.clipped_sum(empty)
    total = sums[SITE]
    assert total.shape == model.blocks()[0].shape and not total.any()
    assert all(not v.any() for v in sums.values())
    before = model.site
    model.update({k: v + 0.01 for k, v in sums.items()}, 0.5)  # the noise alone still moves the release
    assert not np.allclose(model.site, before)


def test_a_record_whose_site_is_not_finite_contributes_nothing_and_the_others_their_own():
    # Reachable only through arrays that bypass parsing (parse_batch refuses |x| > max_abs), e.g. a
    # corrupt checkpoint: the record drops out alone, and the release stays finite and bounded.
    model = GaussianMeanSEP(dim=3, dataset_size=40, clip=1.0, noise_var=0.5)
    x = np.random.default_rng(3).normal(0, 3, (4, 3))
    x[2] = np.inf
    total = model.clipped_sum({"x": x})[SITE]
    others = sum(model.clipped_sum({"x": x[i:i + 1]})[SITE] for i in (0, 1, 3))
    assert np.all(np.isfinite(total)) and np.any(others != 0)
    np.testing.assert_allclose(total, others, rtol=1e-12, atol=1e-15)
    assert not model.clipped_sum({"x": x[2:3]})[SITE].any()
