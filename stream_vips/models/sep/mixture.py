"""DP-SEP clustering: a mixture of J Gaussians with unknown means, learnt diagonal spreads and weights
(DP-SEP paper, section 6.1, extended with private spread statistics).

Model (after Li et al. 2015): mu_j ~ N(m0, prior_var I), h_n ~ Categorical(pi),
x_n | h_n ~ N(mu_{h_n}, Sigma_{h_n}) with Sigma_j = diag(v_j). The posterior over the means is
approximated by prod_j N(mu_j; m_j, V_j) (full, diagonal or isotropic V_j: below), learnt by
DP-SEP; the spreads v_j and the weights pi_j are point estimates made, as post-processing, from
privately released responsibility-weighted statistics (below). With ``learn_spreads=False`` every v_j is noise_sd^2
and pi is uniform (the paper's model with known covariance; only the site is released).

Moment matching. With the cavity prod_j N(mu_j; c_j, C_j), the tilted distribution of a record x
is the mixture over j of "component j absorbed x" (a conjugate update of mu_j) with weights

    r_j ∝ pi_j N(x; c_j, C_j + Sigma_j)                          (responsibilities)

and the other components at their cavity. Its marginal for mu_j is r_j N(P_j) + (1 - r_j) N(C_j),
with P_j = (C_j^-1 + Sigma_j^-1)^-1 and the absorbed mean c_j + delta_j,
delta_j = P_j Sigma_j^-1 (x - c_j), so the projected moments are

    mean_j = c_j + r_j delta_j
    cov_j  = r_j P_j + (1 - r_j) C_j + r_j (1 - r_j) delta_j delta_j^T

and the local site is (cov_j^-1 mean_j, cov_j^-1) minus the cavity's natural parameters. All of
it is vectorized over the batch and the components ((B, J, d, d) arrays; d is small here).

Spread statistics (released with the site, as two more blocks of the same Gaussian release). For
a record x, with the responsibilities r (computed above from public quantities and x) and the
residuals e_j = x - c_j against the public cavity means, the record contributes

    count:  (r_j)_j                                   (J,)     bound C_n = 1
    square: (r_j min(e_ji^2, b^2))_{j,i}              (J, d)   bound C_q = sqrt(d) b^2

with b = ``spread_bound`` (public, in the data's units). The bounds: r_j >= 0 and sum_j r_j = 1,
so ||r||_2 <= ||r||_1 = 1; and ||(r_j w_ji)||_F^2 = sum_j r_j^2 sum_i w_ji^2 <= sum_j r_j^2 d b^4
<= d b^4 with w_ji = min(e_ji^2, b^2) <= b^2. Both are reached (one-hot r, every |e_ji| >= b), and
both vectors are clipped to their bound again in :meth:`MixtureSEP.clipped_sum` (so rounding in
the softmax cannot exceed them). With ``spreads="spherical"`` (one variance per component) the
square is averaged over the coordinates,

    square: (r_j (1/d) sum_i min(e_ji^2, b^2))_j        (J,)     bound C_q = b^2

since each entry is at most r_j b^2 and ||r||_2 <= 1: the bound no longer grows with sqrt(d), so
its noise, spread over J numbers instead of J d, is what a private fit in many dimensions can afford.

Diagonal factors (``mean_covariance="diag"``). EP may project onto any exponential family; with
diagonal precisions it keeps the tilted distribution's mean and marginal variances (the diagonal
of cov_j above, with C_j and P_j diagonal), so a site is 2d numbers per component, each record's
work is O(J d), and the release's noise falls on the d diagonal precisions only (its eigenvalue
floor needs no sqrt(d): :meth:`SEPModel.eigen_floor`). The sensitivity argument is unchanged: the
packed site is still clipped to C.

Isotropic factors (``mean_covariance="spherical"``). The family N(mu; m, sigma^2 I) has sufficient
statistics mu and ||mu||^2, so EP keeps the tilted mean and sigma^2 = (1/d) tr cov_j, the mean of
the diagonal projection's marginal variances; a site is (eta_j, lambda_j): d + 1 numbers per
component. With known spreads the exact posterior of a mean given the assignments is itself
isotropic, so nothing is lost; what is gained is the clip's budget: a record's site
(r x / v, r / v) for component j has norm r sqrt(||x||^2 + 1) / v instead of r sqrt(||x||^2 + d) / v
with a diagonal precision, whose d entries repeat one count; after clipping to C the mean's part,
the signal, is that much larger against the same noise (sqrt(2) at ||x||^2 = d, standardised data).

Sensitivity of one step (replace-one, the engine's adjacency for every family; privacy rule 1).
Responsibilities and residuals depend on the record and on public values only (the cavity,
spreads and weights come from earlier releases), so neighbouring batches differ in one record's
contribution (u_site, u_n, u_q) -> (u'_site, u'_n, u'_q). The site is any vector of norm <= C,
so ||u_site - u'_site|| <= 2 C. The count and square contributions are coordinate-wise
non-negative, so <u, u'> >= 0 and ||u - u'||^2 = ||u||^2 + ||u'||^2 - 2 <u, u'> <= 2 C_k^2:
||u - u'|| <= sqrt(2) C_k. With the engine's allocation a_k (block k gets noise z C_k / a_k,
sum a_k^2 = 1), the neighbouring sums differ by at most, in units of the joint bound,

    diameter = sqrt(4 a_site^2 + 2 a_count^2 + 2 a_square^2)  (<= 2; 2 for an unknown allocation)

(:meth:`MixtureSEP.diameter`; each block's own worst case, summed in squares, bounds the joint
worst case). The default allocation (:meth:`MixtureSEP.default_block_weights`) gives the two
statistics blocks the share ``spread_share`` of sum a_k^2, equally.

Update (post-processing). The averaged statistics take the step u = min(1, spread_damping * s),
s the site's damped step: n_j <- (1 - u) n_j + u n~_j and S_ji <- (1 - u) S_ji + u S~_ji (n~, S~
the engine's noisy batch means; a larger u forgets the start and the early, misassigned steps
faster at the price of more noise, which the shrinkage below then follows), starting at
n_j = 1/J, S_ji = noise_sd^2 / J. The engine's public noise level gives the std of the noise
these averages carry, e_n and e_q per coordinate (the damped sum of the steps'
noise, as for the site's eigenvalue floor). With N the configured dataset size, the prior's
pseudo-records (a conjugate inverse-Gamma prior's shrinkage) are at least ``prior_count`` and at
least enough that the prior's pseudo-sum is :data:`NOISE_SHRINK` times the noise on the data's:

    nu_n = max(prior_count, NOISE_SHRINK N e_n),  nu_q = max(prior_count, NOISE_SHRINK N e_q / noise_sd^2)
    v_ji = min(b^2, max(sd_floor^2, (N max(S_ji, 0) + nu_q noise_sd^2) / (N max(n_j, 0) + nu_q)))
    pi_j ∝ N max(n_j, 0) + nu_n

(S_ji / n_j is a weighted mean of values in [0, b^2], hence the cap). So a small or heavily
noised data set falls back to the prior's spreads and equal weights, the known-sd model; the noise
levels are public and travel in the state (``stat_noise``) with the statistics.

Residuals beyond b are clipped, so v underestimates a component whose sd is near b (by 8% at
sd = b / 2 for Gaussian residuals, under 1% at sd = b / 3).

Components start apart: the initial posterior means are drawn from the prior with the public
``init_seed`` (data-independent), at the prior precision.

>>> m = MixtureSEP(n_components=2, dim=1, dataset_size=4, clip=None, prior_var=4.0, init_seed=1,
...                learn_spreads=False)
>>> batch = m.parse_batch([{"x": [-2.0]}, {"x": [-2.1]}, {"x": [2.0]}, {"x": [2.1]}])
>>> for rho in (1.0, 0.5, 0.5, 0.5):
...     m.update({"site": m.clipped_sum(batch.rows)["site"] / 4}, rho)
>>> sorted(m.posterior()[0].ravel().round(1).tolist())
[-2.0, 2.0]
>>> m.responsibilities(np.array([[-2.0], [2.0]])).round(2).max(axis=1).tolist()
[1.0, 1.0]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy.special import softmax

from stream_vips.models import summaries
from stream_vips.models._validate import integer, optional_positive, positive
from stream_vips.models.base import Block
from stream_vips.models.fit_rule import Settings, settings_from_rule
from stream_vips.models.sep.core import FACTORS, RULE_CLIP, SITE, SEPModel, public_vector, site_rule
from stream_vips.models.synthetic import SyntheticData, check_dimension, malformed_vectors
from stream_vips.privacy.mechanisms import clip_factors

if TYPE_CHECKING:
    from stream_vips.models.auditing import FamilyAudit

COUNT, SQUARE, STAT_NOISE = "count", "square", "stat_noise"
#: The prior's pseudo-sum is at least this multiple of the noise std on the data's sum (module docstring);
#: chosen on the synthetic blobs of benchmarks/sep_mixture_spreads.py (seeds 0-3) among 0.5, 1 and 2.
NOISE_SHRINK = 0.5


class MixtureData(SyntheticData):
    """Points ``{"x": [d numbers]}`` from a mixture of ``n_components`` isotropic Gaussians with
    equal weights and standard deviation ``noise_sd`` (one number, or one per component); the means
    (:attr:`means`, K x d) are ``N(0, spread^2 I)`` draws."""

    def __init__(self, rng: np.random.Generator, n_components: int = 3, dimension: int = 2, spread: float = 2.0,
                 noise_sd: float | Sequence[float] = 0.5) -> None:
        self.dimension = check_dimension(dimension)
        if int(n_components) < 1:
            raise ValueError(f"n_components must be >= 1, got {n_components}")
        if not float(spread) > 0:
            raise ValueError("spread must be > 0")
        super().__init__(rng)
        self.n_components = int(n_components)
        self.sds = public_vector("noise_sd", noise_sd, self.n_components, positive_only=True)
        self.noise_sd = float(self.sds[0]) if np.all(self.sds == self.sds[0]) else self.sds.tolist()
        self.means = float(spread) * rng.standard_normal((self.n_components, self.dimension))
        self.malformed = malformed_vectors(self.dimension)

    def sample_labelled(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh points (n, d) and their components (n,) (advances the generator)."""
        h = self._rng.integers(self.n_components, size=n)
        return self.means[h] + self.sds[h, None] * self._rng.standard_normal((n, self.dimension)), h

    def sample(self, n: int) -> np.ndarray:
        """``n`` fresh points (n, d) (advances the generator)."""
        return self.sample_labelled(n)[0]

    def records(self, n: int) -> list[bytes]:
        return [b'{"x": [%s]}' % ", ".join(map(repr, row)).encode() for row in self.sample(n).tolist()]

    @property
    def model_params(self) -> dict[str, Any]:
        return {"dim": self.dimension}


#: The posterior factor families of a component mean: full, diagonal or isotropic precision.
MEAN_COVARIANCES = FACTORS
#: The components' spreads: one variance per coordinate, or one per component.
SPREADS = ("diag", "spherical")

#: From this many dimensions the fit rule takes diagonal factors and known spreads.
RULE_MANY_DIMENSIONS = 8

#: Components the fit rule gives when the caller names none (the number of clusters is the caller's choice).
RULE_COMPONENTS = 3


class MixtureSEP(SEPModel):
    """DP-SEP clustering: the posterior over the means of a mixture of Gaussians, one Gaussian
    factor per component (full, diagonal or isotropic covariance), learnt by stochastic expectation propagation
    whose clipped local sites are released; each component's diagonal spread and weight are learnt
    from responsibility-weighted counts and clipped squared residuals released in the same Gaussian
    step (module docstring: the statistics, their bounds and the diameter).

    Parameters (public configuration; the others are the SEP core's, ``clip`` defaults to 1 here):

    - ``n_components``: K, the mixture's components (required: the number of clusters is a modelling choice);
    - ``dim``: d, the length of a record's ``x`` (required);
    - ``noise_sd``: the prior guess (and start) of every component's sd in the data's units (default 0.5);
      with ``learn_spreads=False`` the known sd of every component;
    - ``learn_spreads``: learn per-component diagonal spreads and weights privately (default true);
      false: known sd ``noise_sd`` and equal weights, only the site released;
    - ``spread_bound``: b, the public bound each residual coordinate's square is clipped to (b^2;
      default 2, in the data's units: twice a standardised coordinate's sd);
    - ``spread_share``: the share of the noise allocation (sum of a_k^2) given to the two statistics
      blocks (default 0.2; in (0, 1));
    - ``prior_count``: nu, pseudo-records at variance noise_sd^2 that every spread and weight is
      shrunk with (default 10);
    - ``sd_floor``: the least learnt sd (default noise_sd / 10);
    - ``spread_damping``: the statistics' averages step min(1, spread_damping * s), s the site's step
      (default 2: chosen on synthetic blobs among 1, 2 and 3);
    - ``init_seed``: the public draw of the initial component means from the prior (default 0);
    - ``mean_covariance``: the posterior factor of each component mean, ``"full"`` (default),
      ``"diag"`` (diagonal precision: 2d released numbers per component instead of
      d + d(d+1)/2, and O(d) work per record and component instead of O(d^3)) or ``"spherical"``
      (an isotropic precision: d + 1 numbers, the site's norm spent on the mean; module docstring);
    - ``spreads``: ``"diag"`` (default), a variance per component and coordinate, or
      ``"spherical"``, one per component (its statistic has bound b^2 instead of sqrt(d) b^2:
      module docstring).
    """

    family: ClassVar[str] = "sep_mixture"
    record_format: ClassVar[str] = '{"x": [d numbers]}'
    synthetic: ClassVar[type[SyntheticData]] = MixtureData

    @classmethod
    def fit_rule(cls, n: int, d: int, epsilon: float | None, delta: float, non_private: bool) -> Settings:
        """The SEP families' schedule and clip as they are (:func:`~stream_vips.models.sep.core.site_rule`)
        with :data:`RULE_COMPONENTS` components and, from :data:`RULE_MANY_DIMENSIONS` features,
        isotropic factors and known spreads (chosen on synthetic mixtures:
        benchmarks/sep_mixture_covariance.py); the spreads' prior guess, their bound and the mean
        prior keep their defaults (their scale is the data's, which the rule may not read)."""
        many = integer("d", d) >= RULE_MANY_DIMENSIONS
        shape = {"mean_covariance": "spherical", "learn_spreads": False} if many else {}
        why = {"n_components": (f"K = {RULE_COMPONENTS}: a default so that the rule runs; the number of clusters is "
                                "the caller's modelling choice (--param n_components), not a public quantity"),
               "mean_covariance": (f"d = {d} >= {RULE_MANY_DIMENSIONS}: isotropic factors (d + 1 released numbers "
                                   "per component, not d + d(d+1)/2) with the known spreads noise_sd and equal "
                                   "weights; on synthetic mixtures (benchmarks/sep_mixture_covariance.py) learnt "
                                   "spreads, per coordinate or per component, lost the clusters privately from "
                                   "d = 8 on while known ones kept them, and an isotropic factor, whose site "
                                   "spends its norm on the mean and not on d copies of one precision, kept more "
                                   "than a diagonal one; all were alike without noise"
                                   if many else
                                   f"d = {d} < {RULE_MANY_DIMENSIONS}: full factors and learnt diagonal spreads "
                                   "(the model's defaults): as good as diagonal factors at d = 2 on synthetic "
                                   "mixtures, and elongated clusters need a spread per coordinate"),
               "noise_sd": "the model's defaults (noise_sd 0.5 as the spreads' prior guess, spread_bound 2): "
                           "the clusters' spread is in the data's units, which the rule may not read "
                           "(--param noise_sd, spread_bound, prior_var for the data's scale)"}
        return settings_from_rule(cls.family, n, d, epsilon, delta, non_private,
                                  site_rule(n, d, None if non_private else epsilon, delta,
                                            {"n_components": RULE_COMPONENTS, **shape}, why))

    def __init__(
        self,
        *,
        n_components: int,
        dim: int,
        dataset_size: int,
        clip: float | None = RULE_CLIP,
        noise_sd: float = 0.5,
        learn_spreads: bool = True,
        spread_bound: float = 2.0,
        spread_share: float = 0.2,
        prior_count: float = 10.0,
        spread_damping: float = 2.0,
        sd_floor: float | None = None,
        damping: float = 1.0,
        prior_mean: float | Sequence[float] = 0.0,
        prior_var: float = 1.0,
        precision_floor: float | None = None,
        floor_factor: float = 1.0,
        init_seed: int = 0,
        x_clip: float | None = None,
        max_abs: float = 1e6,
        mean_covariance: str = "full",
        spreads: str = "diag",
    ) -> None:
        if mean_covariance not in MEAN_COVARIANCES:
            raise ValueError(f"mean_covariance must be one of {list(MEAN_COVARIANCES)}, got {mean_covariance!r}")
        if spreads not in SPREADS:
            raise ValueError(f"spreads must be one of {list(SPREADS)}, got {spreads!r}")
        super().__init__(
            n_factors=n_components, dim=dim, dataset_size=dataset_size, clip=clip, damping=damping,
            prior_mean=prior_mean, prior_var=prior_var, precision_floor=precision_floor,
            floor_factor=floor_factor, x_clip=x_clip, max_abs=max_abs, factor=mean_covariance,
        )
        self.noise_sd = positive("noise_sd", noise_sd)
        if not isinstance(learn_spreads, bool | np.bool_):
            raise ValueError(f"learn_spreads must be true or false, got {learn_spreads!r}")
        self.learn_spreads = bool(learn_spreads)
        self.spread_bound = positive("spread_bound", spread_bound)
        self.spreads = spreads
        self.spread_share = positive("spread_share", spread_share)
        if not self.spread_share < 1:
            raise ValueError(f"spread_share must be in (0, 1), got {spread_share!r}")
        self.prior_count = positive("prior_count", prior_count)
        self.spread_damping = positive("spread_damping", spread_damping)
        floor = optional_positive("sd_floor", sd_floor)
        self.sd_floor = self.noise_sd / 10.0 if floor is None else floor
        self.init_seed = integer("init_seed", init_seed, minimum=0)
        K, d = self.n_factors, self.dim
        self._count = np.full(K, 1.0 / K)
        self._square = np.full((K,) if spreads == "spherical" else (K, d), self.noise_sd**2 / K)
        self._stat_noise = np.zeros(2)  # noise std on one coordinate of the averaged count, square
        self._stat_step_std = np.zeros(2)  # the engine's noise std on one coordinate of a step's mean
        draws = np.random.default_rng(self.init_seed).standard_normal((K, d))
        start = self.prior_mean + np.sqrt(self.prior_var) * draws
        self._set_posterior(start / self.prior_var, self.prior_precision())

    @classmethod
    def audit(cls) -> FamilyAudit:
        """Points across the line and far out, every site clipped to C = 1/4, the squares to b^2 = 1/4."""
        from stream_vips.models.auditing import FamilyAudit

        return FamilyAudit(
            "sep_mixture",
            lambda capacity: MixtureSEP(n_components=2, dim=1, dataset_size=capacity, clip=0.25, init_seed=0,
                                        spread_bound=0.5),
            tuple({"x": [v]} for v in (-8.0, -3.0, -1.0, 0.0, 1.0, 3.0, 8.0)),
            ratio_floor=0.92,
            floor_reason="the best pair (-1, 3) reaches 0.933: its sites share part of their precision "
                         "direction and its responsibilities are not exactly one-hot",
            note="clip 0.25 clips every site to C; points far apart fall in different components (count and "
                 "square at sqrt(2) of their bounds, as claimed); sites of different points share part of "
                 "their precision part, so ||u - u'|| stays just under 2C")

    # -- the statistics blocks ----------------------------------------------------------------

    @property
    def square_bound(self) -> float:
        """C_q: the L2 bound of one record's square contribution, sqrt(d) b^2, or b^2 with
        spherical spreads (module docstring)."""
        return (1.0 if self.spreads == "spherical" else math.sqrt(self.dim)) * self.spread_bound**2

    def blocks(self) -> tuple[Block, ...]:
        """The site (bound C), and with learnt spreads the counts (bound 1) and squares (bound C_q)."""
        site = super().blocks()
        if not self.learn_spreads:
            return site
        return (*site, Block(COUNT, (self.n_factors,), 1.0), Block(SQUARE, self._square.shape, self.square_bound))

    def default_block_weights(self) -> dict[str, float] | None:
        """a_site^2 = 1 - spread_share, a_count^2 = a_square^2 = spread_share / 2 (public constants)."""
        if not self.learn_spreads:
            return None
        side = math.sqrt(self.spread_share / 2.0)
        return {SITE: math.sqrt(1.0 - self.spread_share), COUNT: side, SQUARE: side}

    def diameter(self, weights: Mapping[str, float] | None = None) -> float:
        """sqrt(4 a_site^2 + 2 a_count^2 + 2 a_square^2): the statistics blocks are non-negative
        (module docstring); 2 when the allocation is not known or only the site is released."""
        if not self.learn_spreads or weights is None:
            return 2.0
        a = {k: float(weights[k]) for k in (SITE, COUNT, SQUARE)}
        return math.sqrt(4.0 * a[SITE] ** 2 + 2.0 * a[COUNT] ** 2 + 2.0 * a[SQUARE] ** 2)

    def spread_statistics(self, r: np.ndarray, diff: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-record count (B, K) and square (B, K, d) contributions, or (B, K) with spherical
        spreads (the squares' mean over the coordinates), each clipped to its bound.

        r are responsibilities (rows sum to 1), diff the residuals x - c_j (B, K, d)."""
        r = np.where(np.isfinite(r), np.clip(r, 0.0, 1.0), 0.0)
        sq = r[..., None] * np.minimum(np.nan_to_num(diff, nan=np.inf) ** 2, self.spread_bound**2)
        if self.spreads == "spherical":
            sq = sq.mean(axis=2)
        count = r * clip_factors(np.linalg.norm(r, axis=1), 1.0)[:, None]
        norms = np.sqrt(np.sum(sq**2, axis=tuple(range(1, sq.ndim))))
        sq = sq * clip_factors(norms, self.square_bound).reshape((-1,) + (1,) * (sq.ndim - 1))
        return count, sq

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The clipped sites' sum and, with learnt spreads, the clipped statistics' sums (behind the wall)."""
        sums = super().clipped_sum(batch)
        if self.learn_spreads:
            X = np.asarray(batch["x"], dtype=float)
            log_ev, diff = self._log_evidence(X, *self._moments(*self.cavity()))
            count, sq = self.spread_statistics(softmax(log_ev, axis=1), diff)
            sums[COUNT], sums[SQUARE] = count.sum(axis=0), sq.sum(axis=0)
        return sums

    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:
        """The site's public noise level (SEP core) and the statistics blocks'."""
        super().set_noise_scale(mean_stds)
        if self.learn_spreads:
            stds = np.array([float(mean_stds[COUNT]), float(mean_stds[SQUARE])])
            if not (np.all(np.isfinite(stds)) and np.all(stds >= 0)):
                raise ValueError(f"statistics noise std must be finite and >= 0, got {stds.tolist()}")
            self._stat_step_std = stds

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """The SEP site update, then the statistics' damped averages (step u); the spreads and
        weights follow from them (:meth:`variances`, :meth:`weights`)."""
        if self.learn_spreads:
            stats = {}
            for name, ref in ((COUNT, self._count), (SQUARE, self._square)):
                m = np.asarray(noisy_mean[name], dtype=float)
                if m.shape != ref.shape or not np.all(np.isfinite(m)):
                    raise ValueError(f"noisy mean {name!r} must be finite of shape {ref.shape}, got {m.shape}")
                stats[name] = m
        super().update(noisy_mean, rho)
        if self.learn_spreads:
            s = min(1.0, self.spread_damping * self.step_fraction(rho))
            self._count = (1.0 - s) * self._count + s * stats[COUNT]
            self._square = (1.0 - s) * self._square + s * stats[SQUARE]
            self._stat_noise = np.sqrt((1.0 - s) ** 2 * self._stat_noise**2 + s**2 * self._stat_step_std**2)

    def prior_counts(self) -> tuple[float, float]:
        """(nu_n, nu_q): the pseudo-records of the weights and of the spreads (module docstring)."""
        N = self.dataset_size
        return (max(self.prior_count, NOISE_SHRINK * N * float(self._stat_noise[0])),
                max(self.prior_count, NOISE_SHRINK * N * float(self._stat_noise[1]) / self.noise_sd**2))

    def variances(self) -> np.ndarray:
        """Diagonal spreads v (K, d): shrunk noisy averages, floored at sd_floor^2 (module docstring)."""
        if not self.learn_spreads:
            return np.full((self.n_factors, self.dim), self.noise_sd**2)
        N, nu = self.dataset_size, self.prior_counts()[1]
        square = np.broadcast_to(np.maximum(self._square, 0.0).reshape(self.n_factors, -1), (self.n_factors, self.dim))
        v = (N * square + nu * self.noise_sd**2) / (N * np.maximum(self._count, 0.0) + nu)[:, None]
        return np.clip(v, min(self.sd_floor, self.spread_bound) ** 2, self.spread_bound**2)

    def weights(self) -> np.ndarray:
        """Mixture weights pi (K,): shrunk noisy counts (uniform without learnt spreads)."""
        if not self.learn_spreads:
            return np.full(self.n_factors, 1.0 / self.n_factors)
        w = self.dataset_size * np.maximum(self._count, 0.0) + self.prior_counts()[0]
        return w / w.sum()

    # -- the SEP site -------------------------------------------------------------------------

    def _moments(self, eta: np.ndarray, prec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Means (J, d) and covariances (J, d, d), or with vector factors variances (J, d) or (J, 1), of
        natural parameters shaped as :meth:`natural_parameters` gives them."""
        if self.diagonal:
            return eta / prec, 1.0 / prec
        cov = np.linalg.inv(prec)
        return np.einsum("jde,je->jd", cov, eta), cov

    def _log_evidence(self, X: np.ndarray, means: np.ndarray, covs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """log pi_j + log N(x; mean_j, cov_j + Sigma_j) (B, J) and the differences x - mean_j (B, J, d);
        ``covs`` (J, d, d), or (J, d) diagonals, or (J, 1) isotropic variances."""
        diff = X[:, None, :] - means[None]
        if covs.ndim == 2:
            S = covs + self.variances()
            maha = np.einsum("bjd,jd->bj", diff**2, 1.0 / S)
            logdet = np.log(S).sum(axis=1)
        else:
            S = covs + np.einsum("jd,de->jde", self.variances(), np.eye(self.dim))
            maha = np.einsum("bjd,jde,bje->bj", diff, np.linalg.inv(S), diff)
            logdet = np.linalg.slogdet(S)[1]
        log_pi = np.log(self.weights())
        return log_pi - 0.5 * (maha + logdet + self.dim * np.log(2.0 * np.pi)), diff

    def local_sites(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per-record, per-component sites proj[tilted] - cavity: (B, J, d), (B, J, d, d), or with
        diagonal factors (B, J, d) twice (the projection keeps the tilted marginal variances), or with
        isotropic ones (B, J, d) and (B, J, 1) (it keeps their mean)."""
        X = np.asarray(batch["x"], dtype=float)
        eta_c, prec_c = self.cavity()
        c, C = self._moments(eta_c, prec_c)
        inv_v = 1.0 / self.variances()
        log_ev, diff = self._log_evidence(X, c, C)
        r = softmax(log_ev, axis=1)[..., None]
        if self.diagonal:
            P = 1.0 / (prec_c + inv_v)
            delta = P * inv_v * diff
            var = r * P + (1.0 - r) * C + r * (1.0 - r) * delta**2
            if self.factor == "spherical":
                var = var.mean(axis=-1, keepdims=True)
            return (c + r * delta) / var - eta_c, 1.0 / var - prec_c
        P = np.linalg.inv(prec_c + np.einsum("jd,de->jde", inv_v, np.eye(self.dim)))
        delta = np.einsum("jde,bje->bjd", P * inv_v[:, None, :], diff)
        mean = c + r * delta
        rr = r[..., None]
        cov = rr * P + (1.0 - rr) * C + rr * (1.0 - rr) * delta[..., :, None] * delta[..., None, :]
        prec = np.linalg.inv(cov)
        prec = 0.5 * (prec + np.swapaxes(prec, -1, -2))
        return np.einsum("bjde,bje->bjd", prec, mean) - eta_c, prec - prec_c

    def responsibilities(self, X: np.ndarray) -> np.ndarray:
        """p(h = j | x) ∝ pi_j N(x; m_j, V_j + diag v_j), rows of X (the posterior predictive)."""
        moments = self._moments(*self.natural_parameters())
        return softmax(self._log_evidence(np.atleast_2d(np.asarray(X, dtype=float)), *moments)[0], axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Most probable component per row of X."""
        return self.responsibilities(X).argmax(axis=1)

    def summary(self) -> dict[str, Any]:
        """The weights, the posterior means and covariances of the component means, the diagonal
        spreads, and the rule :meth:`responsibilities` follows."""
        means, covs = self.posterior()
        out: dict[str, Any] = {
            "kind": "mixture",
            "predictive": "p(component j | x) = weights[j] N(x; means[j], covariances[j] + diag(variances[j])) / "
                          "sum_k weights[k] N(x; means[k], covariances[k] + diag(variances[k])); the prediction "
                          "is the most probable j",
            "noise_sd": self.noise_sd, "weights": self.weights().tolist(), "means": means.tolist(),
            "variances": self.variances().tolist(),
            "notes": ([f"weights and {'spherical' if self.spreads == 'spherical' else 'diagonal'} spreads learnt "
                       "from the released statistics (point estimates)"]
                      if self.learn_spreads else
                      ["the weights are equal and the spreads noise_sd^2 (fixed): the model learns the means only"]),
        }
        if self.dim <= summaries.MATRIX_LIMIT:
            out["covariances"] = covs.tolist()
        else:
            out["notes"].append(f"covariances omitted (d = {self.dim} > {summaries.MATRIX_LIMIT}): invert the "
                                "natural parameter prec")
        return out

    # -- state --------------------------------------------------------------------------------

    @classmethod
    def state_shapes(cls, hyperparameters: Mapping[str, Any]) -> dict[str, tuple[int | None, ...]]:
        k, d = integer("n_components", hyperparameters["n_components"]), integer("dim", hyperparameters["dim"])
        shapes: dict[str, tuple[int | None, ...]] = {"eta": (k, d), "prec": (k, d, d)}
        if hyperparameters.get("learn_spreads", False):  # absent: a message from before
            square = (k,) if hyperparameters.get("spreads") == "spherical" else (k, d)
            shapes.update({COUNT: (k,), SQUARE: square, STAT_NOISE: (2,)})
        return shapes

    def state(self) -> dict[str, np.ndarray]:
        """Posterior natural parameters ``eta``, ``prec``; with learnt spreads the averaged
        statistics ``count`` (K,) and ``square`` (K, d) ((K,) with spherical spreads) and their
        public noise stds ``stat_noise`` (2,)."""
        out = super().state()
        if self.learn_spreads:
            out.update({COUNT: self._count.copy(), SQUARE: self._square.copy(), STAT_NOISE: self._stat_noise.copy()})
        return out

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore a published posterior and, with learnt spreads, its averaged statistics. A state
        without both (a message from before spreads were learnt) keeps the initial statistics, whose
        spreads are exactly noise_sd^2 and weights uniform: that message's own predictive rule."""
        stats = {}
        if self.learn_spreads and (COUNT in state or SQUARE in state):
            for name, ref in ((COUNT, self._count), (SQUARE, self._square), (STAT_NOISE, self._stat_noise)):
                if name not in state:
                    raise ValueError(f"state is missing natural parameter {name!r}")
                value = np.asarray(state[name], dtype=float)
                if value.shape != ref.shape or not np.all(np.isfinite(value)):
                    raise ValueError(f"state {name!r} must be finite of shape {ref.shape}, got {value.shape}")
                stats[name] = value
        super().load_state(state)
        if stats:
            if np.any(stats[STAT_NOISE] < 0):
                raise ValueError("state 'stat_noise' must be >= 0")
            self._count, self._square = stats[COUNT].copy(), stats[SQUARE].copy()
            self._stat_noise = stats[STAT_NOISE].copy()

    def hyperparameters(self) -> dict[str, Any]:
        return {
            "n_components": self.n_factors, "dim": self.dim, "noise_sd": self.noise_sd,
            "learn_spreads": self.learn_spreads, "spread_bound": self.spread_bound,
            "spread_share": self.spread_share, "prior_count": self.prior_count, "sd_floor": self.sd_floor,
            "spread_damping": self.spread_damping, "spreads": self.spreads,
            "mean_covariance": self.factor,
            "init_seed": self.init_seed, **super().hyperparameters(),
        }
