"""VIPS for sigmoid belief networks (VIPS JAIR 2020, Section 7, Algorithm 6) as a streaming family.

Model. A record is a binary vector y in {0, 1}^J (pixels) explained by binary latent units
z in {0, 1}^K: p(z_k = 1) = sigmoid(b_k), p(y_j = 1 | z) = sigmoid(w_j^T z + c_j). Priors:
b ~ N(0, nu_b I), c ~ N(0, nu_c I) and the three-parameter beta normal (TPBN) shrinkage prior of
Gan et al. (2015) on W: W_jk ~ N(0, zeta_jk), zeta_jk ~ Gam(1/2, xi_jk), xi_jk ~ Gam(1/2, phi_k),
phi_k ~ Gam(1/2, omega), omega ~ Gam(1/2, 1) (shape, rate). Pólya-Gamma augmentation with
omega_nj ~ PG(1, .) for every pixel and one PG variable per latent prior makes the complete-data
likelihood Gaussian in (W, c, b) (the paper's eq. 65).

**E-step (behind the privacy wall, eqs. 67-71).** q(w_j, c_j) = N(mu~_j, Sigma~_j) jointly over
the K weights and the bias of pixel j (c_j is the weight of a constant latent unit, zt = (z, 1)),
q(b) Gaussian with diagonal covariance, all public (earlier releases). With
M~_j = E[(w_j, c_j)(w_j, c_j)^T], M_j its W part, E[w_jk c_j] its border and E[c_j^2] its corner:
for every record, q(z_n) = prod_k Bern(pi_nk) starts at pi = sigmoid(E[b]) and a fixed public
number ``inner_iterations`` of rounds runs, each: E[omega_nj] = pg_mean(sqrt(E[psi_nj^2])) with
psi = w_j^T z + c_j, E[psi^2] = pi^T M_j pi + sum_k pi_k (1 - pi_k) M_j,kk + 2 sum_k E[w_jk c_j] pi_k
+ E[c_j^2]; then, all units at once,
d_nk = E[b_k] + sum_j mu_jk (y_nj - 1/2)
       - sum_j E[omega_nj] ((M_j pi_n)_k - M_j,kk pi_nk + E[w_jk c_j] + M_j,kk / 2),
pi_nk <- (1 - lambda) pi_nk + lambda sigmoid(d_nk) with the public ``damping`` lambda (eq. 70;
(M_j pi)_k - M_j,kk pi_k + E[w_jk c_j] = E[psi_j^{\\k} w_jk]).
All units move at once, so the update is damped (lambda = 1/2 by default): undamped parallel
mean-field updates of strongly coupled units oscillate, and on MNIST with K = 100 the
non-private reconstructions then fell from 0.88 to 0.51 within 7 steps (on held-out training
images), while with lambda = 1/2 they rose to 0.96; damping leaves the fixed points unchanged.
One product M_j pi_n per round serves both formulas (n J K^2 multiply-adds, batched GEMMs), and
the released ``xi_zz`` sum is one GEMM of E[omega] (J x n) with the packed <z z^T> (n x K(K+1)/2).

**Released statistics (per record, uncentred, every entry >= 0).** With pi in [0, 1]^K,
E[omega] in [0, 1/4]^J, y in {0, 1}^J, <z_k z_l> = pi_k pi_l (k != l), pi_k (k = l), and a
per-record weight f in (0, 1] (below):

* ``weight`` f                                      (1,)
* ``z``      f pi                                   (K,)
* ``y``      f y                                    (J,)
* ``xi``     f E[omega]                             (J,)
* ``z_y``    f y_j pi_k                             (J, K)
* ``xi_zz``  f E[omega_j] <z_k z_l>, k <= l         (J, K(K+1)/2)

These are the paper's seven blocks less two plus one: E[xi^(1)] (the PG variables of the latent
prior) depends only on q(b), i.e. on earlier releases, so it is computed in the M-step and never
released; the paper's E[omega] E[z]^T block is the diagonal of ``xi_zz`` (<z_k^2> = pi_k); and
``weight`` (sum of f over the batch) lets the M-step centre (y - 1/2 and z - 1/2 need E[f]).
``xi_zz`` is symmetric in (k, l), so only its upper triangle is released.

**Per-record bounds (clipping) and their proof.** Every block of a record is a Kronecker
product of non-negative vectors, so its norm is a product of cheap norms: ||y pi^T|| = ||y||
||pi||, ||E[omega] (x) zz|| = ||E[omega]|| ||zz|| with ||zz||^2 = s + (s^2 - sum_k pi_k^4) / 2,
s = ||pi||^2. The bounds come from three public fractions (constructor ``clip_units`` u,
``clip_omega`` o, ``clip_pixels`` p, each in (0, 1]; 1 is the worst case and never clips):
s <= m := u K active units, rms_j E[omega_j] <= o / 4, ||y||^2 <= p J on pixels, giving

  C_weight = 1, C_z = sqrt(m), C_y = sqrt(p J), C_xi = o sqrt(J) / 4, C_z_y = sqrt(p J m),
  C_xi_zz = (o sqrt(J) / 4) g(m),  g(m)^2 = m + m^2 (K - 1) / (2 K),

where g bounds ||zz|| for s <= m (sum pi^4 >= s^2 / K by Cauchy-Schwarz; g(K)^2 = K(K+1)/2, the
box bound). :meth:`SigmoidBeliefNetwork.clipped_sum` does not rely on that derivation: it maps
pi and E[omega] through nan_to_num and clips them to [0, 1] and [0, 1/4] (in float64, after any
float32 arithmetic), y to {0, 1} (1 iff y > 1/2), computes each block's actual norm n_k for the
record and scales the whole record by one factor f = min(1, min_k C_k / n_k) (times 1 - 1e-9
against rounding). So ||f u_k|| <= C_k for every block whatever the E-step returns, and one
factor keeps the ratios between the blocks: clipping down-weights an atypical record instead of
distorting it, the bias DP-SGD's clipping has. A record clipped by a factor f counts as f records.

Replace-one, jointly, with non-negative entries: the engine scales block k by a_k / C_k (sum
a_k^2 = 1), so a record's scaled concatenation U has non-negative entries and ||U|| <= 1. For two
records, <U, V> >= 0, so ||U - V||^2 = ||U||^2 + ||V||^2 - 2 <U, V> <= 2: the diameter is sqrt(2)
for every allocation (:meth:`SigmoidBeliefNetwork.diameter`), an upper bound: the ``weight``
block is f > 0 for every record, so <U, V> > 0 and the exact diameter is slightly below sqrt(2).
Centred blocks (entries in [-r, r]) would move by 2 C_k instead.

The fractions are a public rule (:data:`RULE_CLIP`, chosen on the synthetic SBN of
``benchmarks/sbn_figure8.py --clip-select``, never on MNIST): records below all three caps
are released exactly; records above are down-weighted.

**M-step (post-processing, Appendix Sec. 5 of the paper with Gan et al.'s TPBN updates).** The
noisy means s_k are used as released, not projected onto their ranges [0, upper]: most entries
of ``xi_zz`` and the background pixels' ``y`` are near 0, where the projection max(0, x + noise)
adds a bias that averaging over steps never removes (on the synthetic SBN, J = 784, K = 50,
S = 400, private accuracy 0.816 with the projection, i.e. all zeros, against 0.840 without;
strong composition on MNIST at S = 1600 fell below all zeros with it). Positive definiteness
comes from the eigenvalue floor below. Then the Robbins-Monro blend nu <- (1 - rho) nu + rho nu_t
of each factor's natural parameters:
q(b): precision 1/nu_b + N s_weight E[xi^(1)] (E[xi^(1)_k] = pg_mean(sqrt(E[b_k^2]))),
h = N (s_z - s_weight / 2); q(w_j, c_j): precision N proj(A_j) + diag(E[1/zeta_j], 1/nu_c),
h = N (s_z_y,j - s_z / 2, s_y,j - s_weight / 2) (the weighted means of (y - 1/2) zt), where
A_j = E[omega_j zt zt^T] is assembled from the noisy means (s_xi_zz,j inside, its diagonal
E[omega_j z_k] = E[omega_j z_k^2] on the border, s_xi,j in the corner), blended, and ``proj``
raises its eigenvalues to a public floor, ``floor_factor * sqrt(K)`` times the blended noise std
of one ``xi_zz`` entry (about the noise's spectral norm), as the logistic family does. Solving
for (w_j, c_j) jointly keeps the update a single concave step: the paper's alternating q(c)
then q(W) updates couple through noisy cross terms that need not form a positive definite joint
matrix, and under noise they diverge (E[c] and E[W] grew without bound on synthetic data).
The start is public pseudo-data: mean (random W of scale ``init_scale``, c = 0), precision
``init_scale^-2``; with the prior's unit variance instead, the E-step's -E[w_jk^2] E[omega_nj]/2
terms switch every unit off for every image, and non-private VB stays at W = 0. Then the TPBN
hyper-posteriors:
q(zeta_jk) = GIG(0, 2 E[xi_jk], E[w_jk^2]), q(xi_jk) = Gam(1, E[zeta_jk] + E[phi_k]),
q(phi_k) = Gam(J/2 + 1/2, E[omega] + sum_j E[xi_jk]), q(omega) = Gam(K/2 + 1/2, 1 + sum_k E[phi_k])
(the paper prints Gam(1, E[zeta]) for xi, dropping E[phi_k] from the rate; the conditional
of xi_jk given zeta_jk and phi_k has both). N is the configured dataset size (public).

**Predictive.** :meth:`SigmoidBeliefNetwork.posterior_z` runs the same E-step on given images
(q(z | y)); :meth:`SigmoidBeliefNetwork.reconstruct_proba` returns p(y_j = 1) for the
reconstruction, sigmoid(E[psi] / sqrt(1 + pi Var[psi] / 8)) under q(z | y) q(theta).

Records: ``{"y": [0, 1, ...]}`` with J numbers 0 or 1, or the packed form ``{"y": "<hex>"}``:
ceil(J/8) bytes in hex, bits most significant first (``numpy.packbits`` order), J bits used and
the padding bits zero.

Length: over the project's 600-line guide because a family is one module: besides the model
it holds everything the package knows about the family (its fit rule, synthetic data, demo and
audit pair: the hooks of :class:`~stream_vips.models.base.Model`).

>>> import numpy as np
>>> model = SigmoidBeliefNetwork(n_visible=4, n_latent=2, dataset_size=100, seed=0)
>>> parsed = model.parse_batch([{"y": [1, 0, 1, 1]}, {"y": "b0"}, {"y": [1, 0.5, 0, 0]}])
>>> parsed.rows["y"].tolist(), [reason for _, reason, _ in parsed.rejected]
([[1, 0, 1, 1], [1, 0, 1, 1]], ['out_of_range'])
>>> sums = model.clipped_sum(parsed.rows)
>>> sorted(sums), sums["xi_zz"].shape, model.diameter()
(['weight', 'xi', 'xi_zz', 'y', 'z', 'z_y'], (4, 3), 1.4142135623730951)
>>> model.update({k: v / 2 for k, v in sums.items()}, rho=1.0)
>>> model.reconstruct_proba(np.array([[1, 0, 1, 1]])).shape
(1, 4)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy.special import expit, kve

from stream_vips.models import summaries
from stream_vips.models._validate import integer, positive
from stream_vips.models.base import Block, Model, ParsedBatch
from stream_vips.models.fit_rule import Settings, settings_from_rule
from stream_vips.models.logistic import pg_mean
from stream_vips.models.synthetic import Demo, SyntheticData
from stream_vips.records import OUT_OF_RANGE, FieldBatch

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit

#: Eigenvalue floor without noise: only negative (rounding) eigenvalues are removed.
_MIN_FLOOR = float(np.finfo(float).tiny)
#: Records per E-step chunk: bounds the (J, K, chunk) work array.
_E_STEP_ROWS = 1024
_DTYPES = ("float64", "float32")
#: Clip factors are shrunk by this relative margin so rounding cannot push a norm past its bound.
_CLIP_MARGIN = 1e-9


def _gig_moments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E[x] and E[1/x] of GIG(p = 0, a, b) (density ~ x^-1 exp(-(a x + b / x) / 2)).

    With s = sqrt(a b): E[x] = sqrt(b/a) K1(s)/K0(s), E[1/x] = sqrt(a/b) K1(s)/K0(s) (scaled
    Bessel functions, so the ratio is stable for large s); b is floored at a tiny positive value.
    """
    b = np.maximum(b, 1e-12)
    s = np.sqrt(a * b)
    ratio = kve(1, s) / kve(0, s)
    return np.sqrt(b / a) * ratio, np.sqrt(a / b) * ratio


#: Malformed images: kind -> line (none is a valid binary image).
MALFORMED_IMAGES: dict[str, str] = {
    "bad_json": '{"y": [1, 0',
    "out_of_range": '{"y": [2, 0, 0, 0]}',
    "wrong_type": '{"y": true}',
    "missing_field": '{"x": [0, 1]}',
    "not_object": "[1, 2, 3]",
}


class ImageData(SyntheticData):
    """Binary images ``{"y": [J bits]}`` from a known sigmoid belief network.

    ``n_latent`` units each switch on a disjoint block of the ``n_visible`` pixels with weight
    ``weight`` (the pattern is easy to read back); pixel biases ``visible_bias``, latent priors
    p(z_k = 1) = sigmoid(``latent_bias``). ``weights`` (J, K), ``visible_bias`` (J,) and
    ``latent_bias`` (K,) are the truth, kept as attributes for scoring.
    """

    def __init__(self, rng: np.random.Generator, n_visible: int = 24, n_latent: int = 3, weight: float = 4.0,
                 visible_bias: float = -2.0, latent_bias: float = 0.0) -> None:
        if int(n_latent) < 1 or int(n_visible) < int(n_latent):
            raise ValueError(f"need 1 <= n_latent <= n_visible, got {n_latent}, {n_visible}")
        super().__init__(rng)
        self.n_visible, self.n_latent = int(n_visible), int(n_latent)
        owner = np.arange(self.n_visible) * self.n_latent // self.n_visible
        self.weights = float(weight) * (owner[:, None] == np.arange(self.n_latent)[None, :])
        self.visible_bias = np.full(self.n_visible, float(visible_bias))
        self.latent_bias = np.full(self.n_latent, float(latent_bias))
        self.malformed = tuple(t.encode() for t in MALFORMED_IMAGES.values())

    def sample(self, n: int) -> np.ndarray:
        """``n`` fresh images (n, J) of 0/1 (advances the generator)."""
        z = (self._rng.random((n, self.n_latent)) < expit(self.latent_bias)).astype(float)
        return (self._rng.random((n, self.n_visible)) < expit(z @ self.weights.T + self.visible_bias)).astype(np.int64)

    def records(self, n: int) -> list[bytes]:
        return [b'{"y": [%s]}' % ", ".join(map(str, row)).encode() for row in self.sample(n).tolist()]

    @property
    def model_params(self) -> dict[str, Any]:
        return {"n_visible": self.n_visible}


def _demo_lines(s: Mapping[str, Any]) -> list[str]:
    return [f"reconstruction       pixel accuracy {s['pixel_accuracy']:.4f} (private), "
            f"{s['non_private_pixel_accuracy']:.4f} (non-private, same records, {s['non_private_updates']} updates)",
            f"                     {s['true_network_pixel_accuracy']:.4f} (true network, its own posterior)"]


def _truth_accuracy(data: ImageData, Y: np.ndarray) -> float:
    """Pixel accuracy on ``Y`` of the true network, as a model whose posterior holds it to 1e-6."""
    model = SigmoidBeliefNetwork(data.n_visible, data.n_latent, 1)
    state = model.state()
    state["w_h"] = data.weights * 1e6  # prior part 1, data part 1e6: E[W] = truth to 1e-6
    state["w_stat"] = np.broadcast_to(1e6 * np.eye(data.n_latent), state["w_stat"].shape).copy()
    state["c_h"], state["c_prec"] = data.visible_bias * 1e6, np.full(data.n_visible, 1e6)
    state["b_h"], state["b_prec"] = data.latent_bias * 1e6, np.full(data.n_latent, 1e6)
    model.load_state(state)
    return pixel_accuracy(Y, model.reconstruct_proba(Y))


class SigmoidBeliefNetwork(Model):
    """Sigmoid belief network by VIPS (records ``{"y": [J bits]}``): K binary latent units explain J
    binary pixels through sigmoid links; Pólya-Gamma augmentation makes each step's statistics
    conditionally Gaussian, and the E-step (mean-field q(z) and the Pólya-Gamma expectations) runs
    behind the privacy wall, each block clipped to a public fraction of its worst case.

    Parameters (public configuration):

    - ``n_visible``: J, the pixels of an image (the family's dimension d);
    - ``n_latent``: K, the latent units;
    - ``dataset_size``: N of the M-step (the reservoir capacity; fit's N);
    - ``inner_iterations``: the fixed public number of E-step rounds;
    - ``nu_b``, ``nu_c``: the prior variances of the latent biases b and the pixel biases c;
    - ``init_scale``: the std of the public random initial mean of W, which breaks the symmetry
      between latent units;
    - ``floor_factor``: scales the eigenvalue floor of the averaged noisy ``xi_zz``;
    - ``damping``: the step in (0, 1] of the parallel q(z) updates (module docstring);
    - ``seed``: the initial mean of W (public randomness: no record enters it); None (the
      default): in a seeded run (``privacy.seed``, ``fit``'s ``seed=``, an estimator's
      ``random_state``) a seed derived from the run's (:func:`stream_vips.core.build.model_seed`),
      else 0. Messages do not carry it (the state replaces the initial W; a derived seed is a
      function of the noise seed);
    - ``dtype``: ``"float32"`` runs the E-step products in single precision (about twice the
      throughput); the E-step outputs are clipped in float64 afterwards, so the bounds hold exactly,
      and the M-step stays in float64;
    - ``clip_units``, ``clip_omega``, ``clip_pixels``: the public clipping fractions of the module
      docstring (None: :data:`RULE_CLIP`; 1: the worst case, no clipping).
    """

    family: ClassVar[str] = "sbn"
    record_format: ClassVar[str] = '{"y": [d bits]}'
    record_field: ClassVar[str] = "y"
    dim_param: ClassVar[str] = "n_visible"
    synthetic: ClassVar[type[SyntheticData]] = ImageData
    #: The public clipping fractions (module docstring), set by the constructor (the rule's when not given).
    clip_units: float
    clip_omega: float
    clip_pixels: float
    demo: ClassVar[Demo[SigmoidBeliefNetwork, ImageData]] = Demo(
        about="sigmoid belief network (K = 3 known latent units over 24 pixels): pixel accuracy of "
              "reconstructed held-out images, next to the true network's",
        source={},
        params=lambda data, seed: {"n_visible": data.n_visible, "n_latent": data.n_latent, "seed": seed},
        held_out=lambda data: data.sample(2_000),
        score=lambda model, data, Y: {"pixel_accuracy": pixel_accuracy(Y, model.reconstruct_proba(Y))},
        reference=lambda data, Y: {"true_network_pixel_accuracy": _truth_accuracy(data, Y)},
        lines=_demo_lines)

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """One pass over the data in expectation: private, :data:`RULE_PRIVATE_STEPS` steps of N / that
        many records averaged uniformly (rho_t = 1/(t+1)); without noise, batches of
        :data:`RULE_NON_PRIVATE_BATCH` records at kappa 0.51; K = :data:`RULE_LATENT` latent units,
        :data:`RULE_INNER_ITERATIONS` E-step rounds and the public clipping fractions ``RULE_CLIP``,
        all chosen on synthetic SBNs (the module's :func:`fit_rule` gives the reasons; docs/sbn.md);
        d is ``n_visible``."""
        r = fit_rule(n, d, None if non_private else epsilon, delta)
        return settings_from_rule(cls.family, n, d, epsilon, delta, non_private,
                                  {**r, "model_params": {**r["model_params"], "n_visible": d}})

    @classmethod
    def regime_warning(cls, n: int, d: int, epsilon: float) -> str | None:
        """Warn at epsilon <= :data:`WEAK_EPSILON` when N / d is at most MNIST's 60,000 / 784.

        Evidence: benchmarks/results/sbn_figure8.json, ``rows`` K = 50, S = 400 (its only
        setting at epsilon <= 1: 0.95 by the RDP accountant; ``epsilons`` row S = 400), 10 seeds
        on MNIST's 60,000 training images of 784 pixels: held-out pixel accuracy 0.889 private,
        0.867 for predicting every pixel off and 0.959 without noise, so the private model keeps
        a quarter of the non-private one's gain over the all-off predictor. The fit's rule takes
        S = N / 20 instead, but with the noise calibrated to a fixed epsilon the averaged noise
        barely depends on S (the rule's own reason), and ``fit`` accounts a step at diameter 2
        where the benchmark used sqrt(2), so it gets no less noise. Fewer images or more pixels
        leave less signal per released entry against that noise (the noise on a released mean
        falls as 1 / N), so the warning extends to N / d below the benchmark's. Above it, or at a
        larger epsilon, no benchmark measured the fit's regime, and the hook says nothing."""
        if epsilon <= WEAK_EPSILON and n / d <= WEAK_RECORDS_PER_PIXEL:
            return (f"sbn at epsilon {epsilon:g} with N / d = {n / d:.3g} records per pixel (at most MNIST's "
                    f"60,000 / 784): in benchmarks/results/sbn_figure8.json (K = 50, S = 400, epsilon 0.95) the "
                    "private model kept only a quarter of the non-private model's gain over predicting every pixel "
                    "off (held-out accuracy 0.889 against 0.867 all-off and 0.959 non-private): expect it to "
                    "learn little")
        return None

    @classmethod
    def audit(cls) -> FamilyAudit:
        """The two halves of the pixels, each owned by one latent unit of a confident public state
        (:func:`_audit_model`), against all-off and all-on images."""
        from stream_vips.models.auditing import FamilyAudit

        half = [1 - j % AUDIT_UNITS for j in range(AUDIT_PIXELS)]  # the pixels unit 0 owns
        return FamilyAudit(
            "sbn", _audit_model,
            tuple({"y": y} for y in (half, [1 - v for v in half], [0] * AUDIT_PIXELS, [1] * AUDIT_PIXELS)),
            ratio_floor=0.9,
            floor_reason="sqrt(2) needs orthogonal contributions, but every record's weight block is f > 0 "
                         "(and E[omega] > 0 on every pixel); best found 0.902",
            note="the two halves of the pixels, each owned by one latent unit of the audit's state "
                 "(_audit_model): near-orthogonal non-negative contributions at their bounds, 0.90 of the "
                 "claimed sqrt(2) (the model at its initial state with J = 3, K = 1 reached 0.58)")

    def __init__(
        self,
        n_visible: int,
        n_latent: int,
        dataset_size: int,
        inner_iterations: int = 4,
        nu_b: float = 1.0,
        nu_c: float = 10.0,
        init_scale: float = 0.1,
        floor_factor: float = 1.0,
        damping: float = 0.5,
        seed: int | None = None,
        dtype: str = "float64",
        clip_units: float | None = None,
        clip_omega: float | None = None,
        clip_pixels: float | None = None,
    ) -> None:
        self.n_visible = integer("n_visible", n_visible)
        self.n_latent = integer("n_latent", n_latent)
        self.dataset_size = integer("dataset_size", dataset_size)
        self.inner_iterations = integer("inner_iterations", inner_iterations)
        self.nu_b = positive("nu_b", nu_b)
        self.nu_c = positive("nu_c", nu_c)
        self.init_scale = positive("init_scale", init_scale)
        self.floor_factor = positive("floor_factor", floor_factor)
        self.damping = positive("damping", damping)
        if self.damping > 1.0:
            raise ValueError(f"damping must be in (0, 1], got {damping!r}")
        self.seed = 0 if seed is None else integer("seed", seed, minimum=0)
        given = {"clip_units": clip_units, "clip_omega": clip_omega, "clip_pixels": clip_pixels}
        for name, value in given.items():
            value = RULE_CLIP[name] if value is None else positive(name, value)
            if value > 1.0:
                raise ValueError(f"{name} must be in (0, 1] (a fraction of the worst case), got {value!r}")
            setattr(self, name, float(value))
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        self.dtype = np.dtype(dtype)
        J, K = self.n_visible, self.n_latent
        self._triu = np.triu_indices(K)
        self._diag = np.flatnonzero(self._triu[0] == self._triu[1])  # diagonal positions in the triangle
        self.xi_zz_noise_std = 0.0
        # natural parameters (blended) of the joint q(w_j, c_j) over K + 1 coordinates (c last). The
        # start is public pseudo-data: W near a random mean of scale init_scale, c near 0, each with
        # variance about init_scale^2 (the prior's variance 1 would make the E-step's
        # -E[w_jk^2] E[omega_nj] / 2 terms switch every unit off for every image, a fixed point
        # where W stays 0 without noise); the first blends (rho_0 = 1 by default) replace it.
        mu0 = np.random.default_rng(self.seed).normal(0.0, self.init_scale, size=(J, K))
        self._w_prior = np.ones((J, K))            # blend of E[1 / zeta]
        self._w_stat = np.zeros((J, K + 1, K + 1))  # blend of N E[omega_j zt zt^T], zt = (z, 1) (unprojected)
        self._w_stat[:, np.arange(K + 1), np.arange(K + 1)] = self.init_scale**-2
        self._w_h = np.hstack([mu0, np.zeros((J, 1))]) * self.init_scale**-2  # blend of h_j = N E[(y_j - 1/2) zt]
        self._b_prec = np.zeros(K)                 # blend of N E[xi^(1)] (data part)
        self._b_h = np.zeros(K)
        self._noise_var = 0.0                      # blended noise variance of one xi_zz mean entry
        # TPBN hyper-posteriors: E[xi_jk], q(phi_k) rate, q(omega) rate (shapes are fixed)
        self._tpbn_xi = np.ones((J, K))
        self._phi_rate = np.full(K, (J / 2 + 0.5))  # E[phi] = 1 at start
        self._omega_rate = np.array([K / 2 + 0.5])  # E[omega] = 1 at start
        self._refresh()

    # ------------------------------------------------------------------ protocol: records
    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"y": (np.dtype(np.uint8), (self.n_visible,))}

    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        """Check ``y`` (J numbers 0 or 1, or the packed hex form); anything else is rejected."""
        objs = list(objs)
        J, nbytes = self.n_visible, (self.n_visible + 7) // 8
        packed_bad: list[tuple[int, str, str]] = []
        for i in [i for i, o in enumerate(objs) if isinstance(o, dict) and isinstance(o.get("y"), str)]:
            try:  # only records in the packed form: expand to a list of bits
                raw = bytes.fromhex(objs[i]["y"])
            except ValueError:
                raw = b""
            bits = np.unpackbits(np.frombuffer(raw, dtype=np.uint8))
            if len(raw) != nbytes or bits[J:].any():
                packed_bad.append((i, OUT_OF_RANGE, f"packed 'y' must be {nbytes} hex bytes with zero padding bits"))
                bits = np.zeros(J, dtype=np.uint8)
            objs[i] = {**objs[i], "y": bits[:J].tolist()}
        batch = FieldBatch(objs)
        for i, reason, detail in packed_bad:
            batch._reject(i, reason, detail)
        y = batch.vector("y", J, max_abs=1e6)
        for i in np.flatnonzero(((y != 0.0) & (y != 1.0)).any(axis=1)).tolist():
            batch._reject(i, OUT_OF_RANGE, "'y' entries must be 0 or 1")
        ok = batch.accepted()
        return ParsedBatch(rows={"y": y[ok].astype(np.uint8)}, accepted=ok, rejected=batch.rejected())

    # ------------------------------------------------------------------ protocol: release
    def blocks(self) -> tuple[Block, ...]:
        J, K = self.n_visible, self.n_latent
        shapes = {"weight": (1,), "z": (K,), "y": (J,), "xi": (J,), "z_y": (J, K), "xi_zz": (J, K * (K + 1) // 2)}
        bounds = self.clip_bounds()
        return tuple(Block(name, shape, bounds[name]) for name, shape in shapes.items())

    def clip_bounds(self) -> dict[str, float]:
        """Per-record L2 bound C_k of each block from the public clipping fractions (module
        docstring): m = clip_units K active units, rms E[omega] <= clip_omega / 4, ||y||^2 <=
        clip_pixels J."""
        J, K = self.n_visible, self.n_latent
        m = self.clip_units * K
        omega = self.clip_omega * math.sqrt(J) / 4.0
        pixels = math.sqrt(self.clip_pixels * J)
        zz = math.sqrt(m + m * m * (K - 1) / (2.0 * K))
        return {"weight": 1.0, "z": math.sqrt(m), "y": pixels, "xi": omega, "z_y": pixels * math.sqrt(m),
                "xi_zz": omega * zz}

    def diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """sqrt(2) for every allocation: all released entries are >= 0, so two records' scaled
        contributions (norm <= 1 each) have a non-negative inner product (module docstring)."""
        return math.sqrt(2.0)

    def default_block_weights(self) -> dict[str, float]:
        """a_k proportional to sqrt(C_k): minimises the sum over blocks of one entry's noise
        variance (z C_k / a_k)^2 under sum a_k^2 = 1, instead of giving every entry the joint
        bound's std; the small blocks that set c and b get far less noise. Public (bounds only)."""
        bounds = {b.name: b.bound for b in self.blocks()}
        norm = math.sqrt(sum(bounds.values()))
        return {name: math.sqrt(c) / norm for name, c in bounds.items()}

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """E-step on the batch and the sums of the per-record clipped statistics (module docstring)."""
        Y = np.asarray(batch["y"])
        if Y.ndim != 2 or Y.shape[1] != self.n_visible:
            raise ValueError(f"batch must hold y of shape (n, {self.n_visible}), got {Y.shape}")
        y = (np.nan_to_num(Y.astype(np.float64), nan=0.0) > 0.5).astype(np.float64)
        J, K = self.n_visible, self.n_latent
        out = {"weight": np.zeros(1), "z": np.zeros(K), "y": np.zeros(J), "xi": np.zeros(J), "z_y": np.zeros((J, K)),
               "xi_zz": np.zeros((J, K * (K + 1) // 2))}
        n = y.shape[0]
        for start in range(0, n, _E_STEP_ROWS):  # chunks bound the (J, K, chunk) work array
            yc = y[start:start + _E_STEP_ROWS]
            pi, xi = self._e_step(yc)
            pi = np.clip(np.nan_to_num(pi.astype(np.float64), nan=0.0), 0.0, 1.0)
            xi = np.clip(np.nan_to_num(xi.astype(np.float64), nan=0.0), 0.0, 0.25)
            zz = self._packed_zz(pi)
            f = self._clip_factors(yc, pi, xi, zz)
            fpi, fxi = f[:, None] * pi, f[:, None] * xi
            out["weight"] += f.sum()
            out["z"] += fpi.sum(axis=0)
            out["y"] += yc.T @ f
            out["xi"] += fxi.sum(axis=0)
            out["z_y"] += yc.T @ fpi
            out["xi_zz"] += fxi.T @ zz  # sum_n f_n xi_nj <z_k z_l>_n as one GEMM
        return out

    def _packed_zz(self, pi: np.ndarray) -> np.ndarray:
        """<z_k z_l> = pi_k pi_l (k < l), pi_k on the diagonal, packed upper triangle (n, K(K+1)/2)."""
        zz = pi[:, self._triu[0]] * pi[:, self._triu[1]]
        zz[:, self._diag] = pi
        return zz

    def _clip_factors(self, y: np.ndarray, pi: np.ndarray, xi: np.ndarray, zz: np.ndarray) -> np.ndarray:
        """One factor per record, min(1, min_k C_k / n_k) (shrunk by ``_CLIP_MARGIN``), from each
        block's actual norm n_k; the Kronecker blocks' norms are products of cheap norms."""
        n_pi, n_y, n_xi, n_zz = (np.sqrt(np.einsum("ij,ij->i", a, a)) for a in (pi, y, xi, zz))
        norms = {"z": n_pi, "y": n_y, "xi": n_xi, "z_y": n_y * n_pi, "xi_zz": n_xi * n_zz}
        f = np.ones(len(y))
        for name, bound in self.clip_bounds().items():
            if name in norms:
                c = bound * (1.0 - _CLIP_MARGIN)
                f = np.minimum(f, np.divide(c, norms[name], out=np.ones_like(f), where=norms[name] > c))
        return f

    def record_weights(self, Y: np.ndarray) -> np.ndarray:
        """The clipping factor f of each row of ``Y`` under the current state (1: released exactly;
        a diagnostic of the clipping bias on data one may look at, e.g. synthetic)."""
        y = self._binary(Y)
        pi, xi = (np.clip(np.nan_to_num(a.astype(np.float64), nan=0.0), 0.0, hi)
                  for a, hi in zip(self._e_step(y), (1.0, 0.25)))
        return self._clip_factors(y, pi, xi, self._packed_zz(pi))

    def _e_step(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """q(z_n) means pi (n, K) and E[omega_n] (n, J) after ``inner_iterations`` rounds."""
        dt = self.dtype
        n = y.shape[0]
        M, diagM, mu, cross, ec2 = self._M, self._diagM, self._mu_w_dt, self._cross, self._ec2
        yh = (y - 0.5).astype(dt)
        # parts of d_nk that do not change between rounds
        fixed = (self._mu_b.astype(dt) + yh @ mu)                      # (n, K)
        cw = cross + 0.5 * diagM                                       # (J, K)
        pi = np.broadcast_to(expit(self._mu_b).astype(dt), (n, self.n_latent)).copy()
        xi = np.zeros((n, self.n_visible), dtype=dt)
        for _ in range(self.inner_iterations):
            Q = np.matmul(pi, M)                                       # (J, n, K): (M_j pi_n)^T, M_j symmetric
            quad = np.einsum("jnk,nk->nj", Q, pi, optimize=True)
            psi2 = quad + (pi - pi * pi) @ diagM.T + 2.0 * (pi @ cross.T) + ec2
            xi = pg_mean(np.sqrt(np.maximum(psi2, 0.0).astype(np.float64))).astype(dt)
            coupling = np.einsum("nj,jnk->nk", xi, Q, optimize=True) - pi * (xi @ diagM) + xi @ cw
            pi = ((1.0 - self.damping) * pi + self.damping * expit(fixed - coupling)).astype(dt)
        return pi, xi

    # ------------------------------------------------------------------ protocol: M-step
    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:
        """The public noise std of one entry of the released ``xi_zz`` mean (sets the floor; the
        ``xi`` entries in the joint matrix have less noise, sqrt(C_xi / C_xi_zz) = g(m)^(-1/2) times as
        much with the default allocation)."""
        std = float(mean_stds["xi_zz"])
        if not (math.isfinite(std) and std >= 0):
            raise ValueError(f"xi_zz noise std must be finite and >= 0, got {std!r}")
        self.xi_zz_noise_std = std

    @property
    def eigen_floor(self) -> float:
        """Public eigenvalue floor of the averaged joint (K + 1) x (K + 1) statistic of (w_j, c_j)
        (at least ``_MIN_FLOOR``): ``floor_factor`` sqrt(K) times the blended noise std of one entry."""
        return max(self.floor_factor * math.sqrt(self.n_latent * self._noise_var), _MIN_FLOOR)

    def _means(self, noisy_mean: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Noisy means as released (non-finite entries to 0), not projected onto their ranges
        [0, upper]: under noise that projection biases the many entries near 0 upwards (module
        docstring). The mean weight is kept at least 1e-6 so the latent prior's data part stays
        positive."""
        out = {}
        for b in self.blocks():
            arr = np.asarray(noisy_mean[b.name], dtype=float)
            if arr.shape != b.shape:
                raise ValueError(f"noisy mean {b.name!r} must have shape {b.shape}, got {arr.shape}")
            out[b.name] = np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)
        out["weight"] = np.maximum(out["weight"], 1e-6)
        return out

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """One stochastic M-step from privatized means: blend q(b), q(c), q(W), then TPBN."""
        if not (0.0 < rho <= 1.0):
            raise ValueError(f"rho must be in (0, 1], got {rho!r}")
        m = self._means(noisy_mean)
        J, K, N = self.n_visible, self.n_latent, float(self.dataset_size)
        A = np.zeros((J, K + 1, K + 1))  # E[omega_j zt zt^T], zt = (z, 1): <z_k> = <z_k^2> on the border
        A[:, self._triu[0], self._triu[1]] = m["xi_zz"]
        A[:, :K, K] = m["xi_zz"][:, self._diag]
        A[:, K, K] = m["xi"]
        A = A + np.triu(A, 1).transpose(0, 2, 1)                 # symmetric, (J, K + 1, K + 1)
        blend = lambda old, new: (1.0 - rho) * old + rho * new  # noqa: E731
        # q(b): the weighted mean of (z - 1/2) is s_z - s_weight / 2
        wt = float(m["weight"][0])
        xi1 = pg_mean(np.sqrt(self._mu_b**2 + self._var_b))
        self._b_prec = blend(self._b_prec, N * wt * xi1)
        self._b_h = blend(self._b_h, N * (m["z"] - 0.5 * wt))
        # joint q(w_j, c_j): no coordinate-wise coupling between W and c to diverge under noise
        self._w_stat = blend(self._w_stat, N * A)
        self._w_h = blend(self._w_h, N * np.hstack([m["z_y"] - 0.5 * m["z"], m["y"][:, None] - 0.5 * wt]))
        self._w_prior = blend(self._w_prior, self._zeta_inv)
        self._noise_var = (1.0 - rho) ** 2 * self._noise_var + rho**2 * self.xi_zz_noise_std**2
        self._refresh()
        self._update_tpbn()

    def _update_tpbn(self) -> None:
        """TPBN hyper-posteriors from q(W), in the order zeta, xi, phi, omega (post-processing)."""
        J, K = self.n_visible, self.n_latent
        w2 = self._diagSigma + self._mu_w**2
        zeta, _ = _gig_moments(2.0 * self._tpbn_xi, w2)
        phi = (J / 2 + 0.5) / self._phi_rate
        self._tpbn_xi = 1.0 / (zeta + phi[None, :])
        omega = (K / 2 + 0.5) / self._omega_rate[0]
        self._phi_rate = omega + self._tpbn_xi.sum(axis=0)
        self._omega_rate = np.array([1.0 + np.sum((J / 2 + 0.5) / self._phi_rate)])

    @property
    def _zeta_inv(self) -> np.ndarray:
        """E[1 / zeta_jk] under the current q(zeta) (from q(W) and E[xi_jk])."""
        w2 = self._diagSigma + self._mu_w**2
        return _gig_moments(2.0 * self._tpbn_xi, w2)[1]

    def _refresh(self) -> None:
        """Moments of the joint q(w_j, c_j) and of q(b) from the blended natural parameters."""
        K, N = self.n_latent, float(self.dataset_size)
        S = 0.5 * (self._w_stat + self._w_stat.transpose(0, 2, 1)) / N
        floor = self.eigen_floor
        eye = np.eye(K + 1)
        try:  # cheap test: every eigenvalue already >= floor, so the projection is the identity
            np.linalg.cholesky(S - floor * eye)
        except np.linalg.LinAlgError:
            vals, vecs = np.linalg.eigh(S)
            S = (vecs * np.maximum(vals, floor)[:, None, :]) @ vecs.transpose(0, 2, 1)
        P = N * S
        P[:, np.arange(K), np.arange(K)] += self._w_prior
        P[:, K, K] += 1.0 / self.nu_c
        Sigma = np.linalg.inv(P)
        Sigma = 0.5 * (Sigma + Sigma.transpose(0, 2, 1))
        mean = np.einsum("jkl,jl->jk", Sigma, self._w_h)
        self._Sigma = Sigma[:, :K, :K]
        self._mu_w, self._mu_c, self._var_c = mean[:, :K], mean[:, K], Sigma[:, K, K].copy()
        self._diagSigma = Sigma[:, np.arange(K), np.arange(K)].copy()
        b_prec = 1.0 / self.nu_b + self._b_prec
        self._mu_b, self._var_b = self._b_h / b_prec, 1.0 / b_prec
        # E[wt wt^T] with wt = (w_j, c_j): the E-step's M_j, E[w_jk c_j] and E[c_j^2], working precision
        dt = self.dtype
        Mt = Sigma + mean[:, :, None] * mean[:, None, :]
        self._M = np.ascontiguousarray(Mt[:, :K, :K], dtype=dt)
        self._diagM = np.ascontiguousarray(Mt[:, np.arange(K), np.arange(K)], dtype=dt)
        self._cross = np.ascontiguousarray(Mt[:, :K, K], dtype=dt)
        self._ec2 = Mt[:, K, K].astype(dt)
        self._mu_w_dt = self._mu_w.astype(dt)

    # ------------------------------------------------------------------ protocol: state
    _STATE = ("w_h", "w_stat", "wc_stat", "w_prior", "c_h", "c_prec", "b_h", "b_prec", "tpbn_xi", "phi_rate",
              "omega_rate", "noise_var")

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        J = integer("n_visible", hyperparameters["n_visible"])
        K = integer("n_latent", hyperparameters["n_latent"])
        return {"w_h": (J, K), "w_stat": (J, K, K), "wc_stat": (J, K), "w_prior": (J, K), "c_h": (J,), "c_prec": (J,),
                "b_h": (K,), "b_prec": (K,), "tpbn_xi": (J, K), "phi_rate": (K,), "omega_rate": (1,),
                "noise_var": (1,)}

    def state(self) -> dict[str, np.ndarray]:
        """Blended natural parameters of the joint q(w_j, c_j) in parts (W: ``w_h``, ``w_stat``; the
        border ``wc_stat``; c: ``c_h``, ``c_prec``; the TPBN prior part), q(b), the TPBN
        hyper-posterior parameters and the public blended noise variance."""
        K = self.n_latent
        return {
            "w_h": self._w_h[:, :K].copy(), "w_stat": self._w_stat[:, :K, :K].copy(),
            "wc_stat": self._w_stat[:, :K, K].copy(), "w_prior": self._w_prior.copy(),
            "c_h": self._w_h[:, K].copy(), "c_prec": self._w_stat[:, K, K].copy(),
            "b_h": self._b_h.copy(), "b_prec": self._b_prec.copy(),
            "tpbn_xi": self._tpbn_xi.copy(), "phi_rate": self._phi_rate.copy(),
            "omega_rate": self._omega_rate.copy(), "noise_var": np.array([self._noise_var]),
        }

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore from :meth:`state` (shapes, finiteness and the signs noise cannot flip checked). A state without
        ``wc_stat`` (the earlier layout, q(c) apart from q(W)) gets a zero border: the
        block-diagonal joint precision keeps every mean and variance as it was."""
        if "wc_stat" not in state:
            state = {**state, "wc_stat": np.zeros((self.n_visible, self.n_latent))}
        arrays = {}
        for name, shape in self.state_shapes(self.hyperparameters()).items():
            if name not in state:
                raise ValueError(f"state has no {name!r}")
            arr = np.array(state[name], dtype=float)
            if arr.shape != shape:
                raise ValueError(f"state {name!r} must have shape {shape}, got {arr.shape}")
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"state {name!r} must be finite")
            arrays[name] = arr
        # w_stat and c_prec are blends of noisy means used as released (negative entries are valid
        # there; the eigenvalue floor makes the precision positive definite in _refresh). b_prec is
        # N E[f] E[xi^(1)] with the weight kept >= 1e-6, so it is >= 0 even under noise.
        positive_names = ("w_prior", "tpbn_xi", "phi_rate", "omega_rate")
        if any(np.any(arrays[k] <= 0) for k in positive_names) or np.any(arrays["b_prec"] < 0) \
                or arrays["noise_var"][0] < 0:
            raise ValueError("state prior precisions and TPBN rates must be positive, b_prec and noise_var >= 0")
        J, K = self.n_visible, self.n_latent
        self._w_stat = np.zeros((J, K + 1, K + 1))
        self._w_stat[:, :K, :K], self._w_stat[:, K, K] = arrays["w_stat"], arrays["c_prec"]
        self._w_stat[:, :K, K] = self._w_stat[:, K, :K] = arrays["wc_stat"]
        self._w_h = np.hstack([arrays["w_h"], arrays["c_h"][:, None]])
        self._w_prior = arrays["w_prior"]
        self._b_h, self._b_prec = arrays["b_h"], arrays["b_prec"]
        self._tpbn_xi, self._phi_rate, self._omega_rate = arrays["tpbn_xi"], arrays["phi_rate"], arrays["omega_rate"]
        self._noise_var = float(arrays["noise_var"][0])
        self._refresh()

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "n_visible": self.n_visible, "n_latent": self.n_latent, "dataset_size": self.dataset_size,
            "inner_iterations": self.inner_iterations, "nu_b": self.nu_b, "nu_c": self.nu_c,
            "init_scale": self.init_scale, "floor_factor": self.floor_factor, "damping": self.damping,
            "xi_zz_noise_std": self.xi_zz_noise_std, "dtype": self.dtype.name, "clip_units": self.clip_units,
            "clip_omega": self.clip_omega, "clip_pixels": self.clip_pixels,
        }

    # ------------------------------------------------------------------ prediction
    @property
    def weights(self) -> np.ndarray:
        """E[W] (J, K)."""
        return self._mu_w.copy()

    @property
    def visible_bias(self) -> np.ndarray:
        """E[c] (J,)."""
        return self._mu_c.copy()

    @property
    def latent_bias(self) -> np.ndarray:
        """E[b] (K,)."""
        return self._mu_b.copy()

    def summary(self) -> dict[str, Any]:
        """The posterior means of the weights and biases (when J x K is small) and a statement: an
        image's reconstruction needs inference over the latent units with the full parameters."""
        out: dict[str, Any] = {
            "kind": "network",
            "predictive": "not in closed form: reconstructing or scoring an image y needs the E-step for "
                          "q(z | y) over the full natural parameters (w_h, w_stat, ...); with pi = q(z = 1 | y), "
                          "p(y_j = 1) is approximately sigmoid(weights[j] . pi + visible_bias[j])",
            "n_visible": self.n_visible, "n_latent": self.n_latent, "notes": []}
        if self.n_visible * self.n_latent <= summaries.MATRIX_LIMIT**2:
            out.update(weights=self.weights.tolist(), visible_bias=self.visible_bias.tolist(),
                       latent_bias=self.latent_bias.tolist())
        else:
            out["notes"].append("weights omitted (J x K above the summary's limit): the natural parameters hold them")
        return out

    def _binary(self, Y: np.ndarray) -> np.ndarray:
        Y = np.atleast_2d(np.asarray(Y, dtype=float))
        if Y.shape[1] != self.n_visible:
            raise ValueError(f"Y must have {self.n_visible} columns, got {Y.shape[1]}")
        return (np.nan_to_num(Y, nan=0.0) > 0.5).astype(float)

    def posterior_z(self, Y: np.ndarray) -> np.ndarray:
        """q(z_k = 1 | y) for each row of ``Y`` (n, K), by the training E-step."""
        return self._e_step(self._binary(Y))[0].astype(float)

    def reconstruct_proba(self, Y: np.ndarray) -> np.ndarray:
        """p(y_j = 1) of the reconstruction of each row of ``Y`` through q(z | y) (n, J)."""
        pi = self.posterior_z(Y)
        mean = pi @ self._mu_w.T + self._mu_c
        M = self._M.astype(float)
        quad = np.einsum("jnk,nk->nj", np.matmul(pi, M), pi)
        second = quad + (pi - pi * pi) @ self._diagM.astype(float).T + 2.0 * (pi @ self._cross.astype(float).T) \
            + self._ec2.astype(float)
        var = np.maximum(second - mean**2, 0.0)
        return expit(mean / np.sqrt(1.0 + np.pi * var / 8.0))


def pixel_accuracy(Y: np.ndarray, proba: np.ndarray) -> float:
    """Fraction of pixels where the thresholded reconstruction (p > 1/2) equals the image: one
    minus the mean squared distance between binary images, the paper's Figure 8 measure."""
    return float(np.mean((np.asarray(proba) > 0.5) == (np.asarray(Y) > 0.5)))


#: Pixels and latent units of the audit's network; unit k owns the pixels j = k (mod K).
AUDIT_PIXELS, AUDIT_UNITS = 32, 2


def _audit_model(capacity: int) -> SigmoidBeliefNetwork:
    """An SBN in a state where each latent unit explains its own half of the pixels, so the two
    halves' images have near-orthogonal contributions (the worst case the diameter allows).

    The posterior is confident (precision 10^4 on every weight and bias): E[W_jk] = 8 where unit k
    owns pixel j, 0 elsewhere, E[c] = 0, E[b] = -1/2 -- a public state the model can hold after
    releases. The image "pixels of unit k on" gives pi = 0.96 e_k + 0.02 (four damped E-step
    rounds), E[omega] = 0.065 on its own pixels and 0.2 on the others, so every block but
    ``weight`` (and a little of ``xi``) of one image is nearly orthogonal to the other's. The
    public clipping fractions (u, o, p) = (1/2, 0.6, 1/2) put the pair's ``weight``, ``y`` and
    ``xi`` blocks at their bounds, ``z`` and ``z_y`` at 0.96 and ``xi_zz`` at 0.86 (g(m) allows
    for spread units); unclipped (f = 1), so the shared ``weight`` block (a^2 = 0.085) is the main
    loss. Chosen by a grid search over J, K, the state, the fractions and E-step rounds (the
    model's default 4 kept for speed: 8 rounds reach 0.93, at about 1.4x the run time).
    """
    J, K, precision = AUDIT_PIXELS, AUDIT_UNITS, 1e4
    model = SigmoidBeliefNetwork(n_visible=J, n_latent=K, dataset_size=capacity, seed=0,
                                 clip_units=0.5, clip_omega=0.6, clip_pixels=0.5)
    state = model.state()
    owned = np.arange(J)[:, None] % K == np.arange(K)
    state.update(w_stat=np.broadcast_to(precision * np.eye(K), (J, K, K)).copy(), wc_stat=np.zeros((J, K)),
                 w_h=8.0 * owned * (precision + state["w_prior"]), c_prec=np.full(J, precision), c_h=np.zeros(J),
                 b_prec=np.full(K, precision), b_h=np.full(K, -0.5 * (precision + 1.0 / model.nu_b)))
    model.load_state(state)
    return model


#: Fit-rule constants, chosen on synthetic SBN data (benchmarks/sbn_figure8.py ``--select``).
#: The regime :meth:`SigmoidBeliefNetwork.regime_warning` warns about (benchmarks/results/sbn_figure8.json,
#: K = 50, S = 400): epsilon at most 1 with at most 60,000 / 784 records per pixel.
WEAK_EPSILON = 1.0
WEAK_RECORDS_PER_PIXEL = 60_000 / 784
RULE_PRIVATE_STEPS = 20
RULE_NON_PRIVATE_BATCH = 400
RULE_TAU0 = 1.0
RULE_KAPPA = {"private": 1.0, "non_private": 0.51}
RULE_LATENT = 50
RULE_INNER_ITERATIONS = 4
#: Public clipping fractions (module docstring), chosen on the synthetic SBN (``--clip-select``).
RULE_CLIP = {"clip_units": 0.36, "clip_omega": 0.77, "clip_pixels": 0.19}


def fit_rule(n: int, d: int, epsilon: float | None, delta: float, *, n_latent: int | None = None,
             batch_size: int | None = None) -> dict[str, Any]:
    """Settings for fitting an SBN to ``n`` binary vectors of length ``d`` from public quantities
    only (``epsilon`` None: non-private); ``n_latent`` / ``batch_size`` override the rule's K / S
    (Figure 8's grid). Returns q, batch_size, steps (one pass), tau0 and kappa of
    rho_t = (tau0 + t)^-kappa, block_weights (None: the family default), the model's
    constructor parameters and one reason per choice.

    >>> r = fit_rule(60_000, 784, 1.0, 1e-4)
    >>> r["batch_size"], r["steps"], r["kappa"], r["model_params"]["n_latent"]
    (3000, 20, 1.0, 50)
    >>> fit_rule(60_000, 784, None, 1e-4)["batch_size"]
    400
    """
    n, d = integer("n", n), integer("d", d)
    private = epsilon is not None
    if epsilon is not None and not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0 (or None for non-private), got {epsilon!r}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    K = RULE_LATENT if n_latent is None else integer("n_latent", n_latent)
    if batch_size is not None:
        S = min(integer("batch_size", batch_size), n)
    else:
        S = max(1, n // RULE_PRIVATE_STEPS) if private else min(n, RULE_NON_PRIVATE_BATCH)
    kappa = RULE_KAPPA["private" if private else "non_private"]
    why = {
        "batch_size": (f"private: n / {RULE_PRIVATE_STEPS}, so one pass is {RULE_PRIVATE_STEPS} releases; "
                       "with the noise calibrated to a fixed epsilon the averaged noise barely depends on S "
                       "(z grows like sqrt(S/n)), "
                       "and about 20 E-steps suffice for the posterior to settle on synthetic SBNs"
                       if private else f"non-private: {RULE_NON_PRIVATE_BATCH} records (the paper's smallest S), many "
                       "cheap steps in one pass"),
        "steps": "one pass over the data in expectation (n / S steps), as in the paper's Figure 8",
        "tau0": f"tau0 = {RULE_TAU0:g}: rho_0 = 1, the first release replaces the public starting point",
        "kappa": ("kappa = 1: rho_t = 1/(t+1) averages the noisy releases uniformly; on the synthetic SBN at "
                  "z = 2 it beat kappa 0.5 by 3 points at S = 400 and tied at S = 3200" if private else
                  "kappa = 0.51: forgets the early E-steps (made under a poor posterior) quickly; 0.5 was best or "
                  "tied without noise on the synthetic SBN, and 0.51 keeps it inside the Robbins-Monro range "
                  "(0.5, 1] that the configuration enforces"),
        "block_weights": "family default a_k proportional to sqrt(C_k) (public bounds only)",
        "n_latent": f"K = {K}: the paper's smaller setting unless given",
        "inner_iterations": (f"{RULE_INNER_ITERATIONS} E-step rounds: on the synthetic SBN q(z) is within 0.015 "
                             "(mean abs) of 16 rounds (0.037 at 2, 0.004 at 8); E-step cost is linear in rounds"),
        "init_scale": "0.1: small random start that breaks the symmetry between units without switching them off",
        "floor_factor": "1: eigenvalue floor at about half the spectral edge of the symmetric noise",
        "damping": "1/2: parallel q(z) updates of coupled units oscillate undamped (non-private VB diverged)",
        "clip": ("per-record clipping at the median, on the synthetic SBN, of s / K (s = ||E[z]||^2), 4 rms E[omega] "
                 "and the fraction of on pixels (0.36, 0.77, 0.19): private accuracy 0.867 / 0.875 at S = 400 / 3200 "
                 "against 0.839 / 0.866 unclipped (0.865 / 0.875 at the 0.9 quantile; 0.1 to 0.5 tie and the "
                 "median has the least bias), without noise 0.878 either way"),
    }
    return {"q": S / n, "batch_size": S, "steps": max(1, n // S), "tau0": RULE_TAU0, "kappa": kappa,
            "block_weights": None,
            "model_params": {"n_latent": K, "dataset_size": n, "inner_iterations": RULE_INNER_ITERATIONS,
                             "init_scale": 0.1, "floor_factor": 1.0, "damping": 0.5, **RULE_CLIP},
            "why": why}
