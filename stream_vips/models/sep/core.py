"""DP-SEP core: stochastic expectation propagation on Gaussian factors, in natural parameters.

The approximate posterior is a product of K independent Gaussian factors over d-dimensional
parameters (a mixture's K component means, or one weight vector), stored as natural parameters
theta = (eta_k = Lambda_k mu_k, Lambda_k) per factor. SEP (Li et al. 2015; DP-SEP paper,
Algorithm 2) keeps one averaged site f, so that q = p0 * f^N, i.e. theta_q = theta_0 + N theta_f,
where N is the configured dataset size (the reservoir capacity M: configuration, never a count
of the data, privacy rule 5 in docs/privacy.md).

Packing. One record's site (eta, Lambda) is released through the vector
v = (eta_k, diag Lambda_k, sqrt(2) * upper Lambda_k  for k = 1..K), whose L2 norm is
sqrt(sum_k ||eta_k||^2 + ||Lambda_k||_F^2), the norm of the natural parameters the paper clips;
i.i.d. noise on v puts std s on diagonals and s / sqrt(2) on each symmetric off-diagonal pair,
exactly like :func:`stream_vips.privacy.mechanisms.symmetric_noise`. One block ``"site"`` of
length K * (d + d(d+1)/2) carries the whole release, so the paper's joint clipping to C and the
engine's one-block noise z * C agree exactly.

One step (the streaming form of Algorithm 3). The engine draws a batch B from the full reservoir
(fixed size S, or Poisson with rate q) and calls :meth:`SEPModel.clipped_sum`:

1. cavity theta_cav = theta_q - theta_f = theta_0 + (N - 1) theta_f (public: built from the
   previous privatized state);
2. for each record n in B, the tilted distribution q_cav * p(x_n | .) is projected onto the
   Gaussian family (moment matching) and its local site theta_fn = proj - theta_cav computed;
3. theta_fn is clipped to ||theta_fn|| <= C (``clip``), and the batch sum is returned.

The engine adds N(0, (z C)^2) to every coordinate of the sum and divides by the public
normaliser Z (S, or q * M; privacy rule 4 in docs/privacy.md): m~ = (sum_{n in B} clip(theta_fn) +
e) / Z. Then :meth:`SEPModel.update` (post-processing) does the damped update of the averaged site
with step s = min(1, gamma * rho_t) and forms the released posterior natural parameters

    theta_new = theta_0 + N [(1 - s) theta_f + s m~]                                   (R)

(with S = 1 and s = gamma / N^2 this is the paper's eq. 5, theta_new = theta_0 +
(N - gamma/N) theta_f + (gamma/N) theta_fn; with s = gamma / N it is Li et al.'s
f <- f^(1 - gamma/N) f_n^(gamma/N)), projects each precision to eigenvalues >= a public floor
(post-processing, after the noise), and refreshes the site theta_f = (theta_new - theta_0) / N,
clipped to ||theta_f|| <= C. Every step releases: no step is skipped or left un-noised for a
data-dependent reason (privacy rule 8 in docs/privacy.md).

Sensitivity of one step (replace-one, privacy rule 1 in docs/privacy.md). theta_f and theta_0 are
the same on neighbouring streams (previous releases are post-processed public values), and reservoir
membership and the batch depend only on positions and the RNG, so neighbouring batches differ in
at most one record, whose clipped site changes from u to u' with ||u||, ||u'|| <= C. In (R) only
the term N s m~ depends on the batch, hence

    ||theta_new - theta_new'|| = (N s / Z) ||u - u'|| <= 2 N s C / Z.

So one record moves the released natural parameters by at most 2 * (N s C / Z): its bound in the
released statistic is C_rel = N s C / Z (:meth:`SEPModel.release_bound`), the replace-one
diameter is 2 C_rel, and for S = 1, s = gamma / N^2 this is the paper's Delta = 2 gamma C / N
(Proposition 1).

Noise equivalence. The engine's noise e ~ N(0, (z C)^2 I) on the clipped sum enters (R) through
the public affine map m~ -> theta_new, so the released natural parameters carry Gaussian noise of
std N s z C / Z = z * C_rel on every packed coordinate: exactly the paper's step 9 (noise on
theta_new with std sigma * Delta) with the paper's sigma = std / Delta = z / 2 (privacy rule 2 in
docs/privacy.md), and the event the engine records (noise multiplier z on a sum with per-record
bound C, diameter 2) describes it. Precision projection, site refresh and clipping act on theta_new
only and are post-processing.

Modes: ``clip=None`` is plain SEP (no clipping; only usable with the engine's non-private mode),
``clip=C`` with the engine in non-private mode is clipped SEP, and with z > 0 it is DP-SEP.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from stream_vips.models._validate import integer, optional_positive, positive
from stream_vips.models.base import Block, Model, ParsedBatch
from stream_vips.privacy.mechanisms import clip_factors, project_pd
from stream_vips.records import FieldBatch

SITE = "site"


#: The Gaussian factor families: a full precision matrix, a diagonal one (d entries), or an
#: isotropic one (lambda I: one entry).
FACTORS = ("full", "diag", "spherical")


def precision_width(dim: int, factor: str) -> int | None:
    """Entries stored per factor for a vector precision: d (``"diag"``), 1 (``"spherical"``), or
    None for a full matrix."""
    if factor not in FACTORS:
        raise ValueError(f"factor must be one of {list(FACTORS)}, got {factor!r}")
    return None if factor == "full" else dim if factor == "diag" else 1


def packed_size(n_factors: int, dim: int, factor: str = "full") -> int:
    """Length of the packed natural parameters of ``n_factors`` d-dimensional Gaussians of the
    ``factor`` family (:data:`FACTORS`)."""
    width = precision_width(dim, factor)
    return n_factors * (dim + (dim * (dim + 1) // 2 if width is None else width))


def pack(eta: np.ndarray, prec: np.ndarray) -> np.ndarray:
    """(..., K, d), (..., K, d, d) natural parameters -> (..., K * P) vectors with the norm of (eta, prec).

    Per factor: eta, then diag(prec), then sqrt(2) times the strict upper triangle (row-major), so
    ||pack(eta, prec)||_2^2 = sum_k ||eta_k||^2 + ||prec_k||_F^2 for symmetric prec. A vector
    precision (..., K, w) (a diagonal, w = d, or an isotropic lambda, w = 1) is packed as it is
    after eta: its norm is the norm of those w numbers (the released coordinates).
    """
    eta = np.asarray(eta, dtype=float)
    prec = np.asarray(prec, dtype=float)
    if prec.ndim == eta.ndim:
        both = np.concatenate([eta, prec], axis=-1)
        return both.reshape(*both.shape[:-2], both.shape[-2] * both.shape[-1])
    d = eta.shape[-1]
    iu = np.triu_indices(d, 1)
    diag = np.diagonal(prec, axis1=-2, axis2=-1)
    off = np.sqrt(2.0) * prec[..., iu[0], iu[1]]
    per_factor = np.concatenate([eta, diag, off], axis=-1)
    return per_factor.reshape(*per_factor.shape[:-2], per_factor.shape[-2] * per_factor.shape[-1])


def unpack(v: np.ndarray, n_factors: int, dim: int, factor: str = "full") -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`pack`: (..., K * P) -> eta (..., K, d) and a symmetric prec (..., K, d, d),
    or for a ``"diag"`` or ``"spherical"`` factor the vector precision (..., K, d) or (..., K, 1)."""
    v = np.asarray(v, dtype=float)
    d = dim
    width = precision_width(dim, factor)
    if width is not None:
        per = v.reshape(*v.shape[:-1], n_factors, d + width)
        return per[..., :d].copy(), per[..., d:].copy()
    per = v.reshape(*v.shape[:-1], n_factors, d + d * (d + 1) // 2)
    eta = per[..., :d]
    prec = np.zeros(per.shape[:-1] + (d, d))
    idx = np.arange(d)
    prec[..., idx, idx] = per[..., d : 2 * d]
    iu = np.triu_indices(d, 1)
    off = per[..., 2 * d :] / np.sqrt(2.0)
    prec[..., iu[0], iu[1]] = off
    prec[..., iu[1], iu[0]] = off
    return eta.copy(), prec


def public_vector(name: str, value: Any, dim: int, positive_only: bool = False) -> np.ndarray:
    """A public constant given as one number or ``dim`` numbers (finite; > 0 with
    ``positive_only``), as a vector of length ``dim``; ValueError naming ``name`` otherwise."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        arr = np.full(0, np.nan)
    if arr.ndim == 0:
        arr = np.full(dim, float(arr))
    if arr.shape != (dim,) or not np.all(np.isfinite(arr)) or (positive_only and np.any(arr <= 0)):
        kind = "positive" if positive_only else "finite"
        raise ValueError(f"{name} must be a {kind} number or a list of {dim} {kind} numbers, got {value!r}")
    return arr


class DampedSite:
    """What every SEP family shares about its one released site: the damped step fraction and
    the public noise level the engine reports (``damping`` and ``site_noise_std`` attributes)."""

    damping: float
    site_noise_std: float

    def step_fraction(self, rho: float) -> float:
        """s = min(1, gamma * rho): the weight of this step's site mean in the averaged site."""
        if not (math.isfinite(rho) and 0 < rho <= 1):
            raise ValueError(f"step size rho must be in (0, 1], got {rho!r}")
        return min(1.0, self.damping * rho)

    def set_noise_scale(self, mean_stds: Mapping[str, float]) -> None:
        """Tell the model the public noise std on each coordinate of the released mean (z C / Z)."""
        std = float(mean_stds[SITE])
        if not (math.isfinite(std) and std >= 0):
            raise ValueError(f"site noise std must be finite and >= 0, got {std!r}")
        self.site_noise_std = std


class SEPModel(DampedSite, Model):
    """Shared DP-SEP machinery for families whose posterior is K independent d-dim Gaussians.

    Subclasses define the local sites of a batch (``local_sites``, or an override of
    ``clipped_sum`` for structured sites) and their read-side predictions. Records default to
    ``{"x": [dim numbers]}`` (:meth:`parse_batch`); families with more fields override
    ``row_layout`` and ``parse_batch``. Constructor arguments (all public configuration):

    - ``dataset_size``: N in theta_q = theta_0 + N theta_f; set it to the reservoir capacity M;
    - ``clip``: C, the L2 bound on every local site and on the site f (``None``: plain SEP);
    - ``damping``: gamma, the SEP step is s = min(1, gamma * rho_t);
    - ``prior_mean`` / ``prior_var``: the isotropic Gaussian prior of every factor;
    - ``precision_floor``: eigenvalue floor of the projected posterior precisions (default: the
      prior precision 1 / prior_var, a public constant);
    - ``floor_factor``: with the public noise level known (:meth:`set_noise_scale`) the floor is
      raised to floor_factor * sqrt(d) * (std of the noise on one diagonal entry of the posterior
      precision), about half the expected spectral norm of that noise matrix;
    - ``x_clip``: L2 bound the inputs x are clipped to (``None``: no clipping);
    - ``max_abs``: records with a |coordinate| beyond it are rejected as out of range;
    - ``factor``: the Gaussian family of every factor (:data:`FACTORS`): ``"full"`` precision
      matrices, ``"diag"`` (EP projects onto diagonal precisions: the tilted distribution's mean
      and marginal variances), so a site has 2d numbers per factor instead of d + d(d+1)/2 and the
      release's noise falls on d precision entries, not d(d+1)/2, or ``"spherical"`` (lambda I:
      the tilted mean and the mean of its marginal variances, whose sufficient statistics are mu
      and ||mu||^2), d + 1 numbers per factor with the noise on one precision entry.
    """

    def __init__(
        self,
        *,
        n_factors: int,
        dim: int,
        dataset_size: int,
        clip: float | None,
        damping: float = 1.0,
        prior_mean: float | Sequence[float] = 0.0,
        prior_var: float = 1.0,
        precision_floor: float | None = None,
        floor_factor: float = 1.0,
        x_clip: float | None = None,
        max_abs: float = 1e6,
        factor: str = "full",
    ) -> None:
        self.n_factors = integer("n_factors", n_factors)
        self.dim = integer("dim", dim)
        self.dataset_size = integer("dataset_size", dataset_size)
        self.clip = optional_positive("clip", clip)
        self.damping = positive("damping", damping)
        self.prior_var = positive("prior_var", prior_var)
        self.prior_mean = public_vector("prior_mean", prior_mean, self.dim)
        floor = 1.0 / self.prior_var if precision_floor is None else precision_floor
        self.precision_floor = positive("precision_floor", floor)
        self.floor_factor = positive("floor_factor", floor_factor)
        self.x_clip = optional_positive("x_clip", x_clip)
        self.max_abs = positive("max_abs", max_abs)
        self.site_noise_std = 0.0  # public std of the noise on one coordinate of the released mean
        self._noise_var = 0.0  # variance of the noise carried by one packed coordinate of theta_f
        self.width = precision_width(self.dim, factor)
        self.factor = factor
        K, d = self.n_factors, self.dim
        prior_eta = np.broadcast_to(self.prior_mean / self.prior_var, (K, d))
        self._prior = pack(prior_eta, self.prior_precision())
        self._site = np.zeros(packed_size(K, d, factor))

    @property
    def diagonal(self) -> bool:
        """Whether the factors' precisions are vectors (``"diag"`` or ``"spherical"``), not matrices."""
        return self.width is not None

    def prior_precision(self) -> np.ndarray:
        """The prior precision of every factor, shaped as :meth:`natural_parameters` gives it."""
        K, d = self.n_factors, self.dim
        if self.width is None:
            return np.broadcast_to(np.eye(d) / self.prior_var, (K, d, d))
        return np.full((K, self.width), 1.0 / self.prior_var)

    # -- protocol -----------------------------------------------------------------------------

    def row_layout(self) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
        return {"x": (np.dtype(np.float64), (self.dim,))}

    def parse_batch(self, objs: Sequence[Any]) -> ParsedBatch:
        """``{"x": [d numbers]}``; x clipped to norm ``x_clip`` when configured."""
        fields, x = parse_vectors(objs, self.dim, self.x_clip, self.max_abs)
        ok = fields.accepted()
        return ParsedBatch(rows={"x": x[ok]}, accepted=ok, rejected=fields.rejected())

    def blocks(self) -> tuple[Block, ...]:
        """One block: the packed sum of clipped local sites (bound C; infinite for plain SEP)."""
        bound = math.inf if self.clip is None else self.clip
        return (Block(SITE, (packed_size(self.n_factors, self.dim, self.factor),), bound),)

    @abstractmethod
    def local_sites(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Per-record local sites (eta (B, K, d), prec (B, K, d, d)) against the current cavity."""

    def clipped_sum(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Sum over the batch of the packed local sites, each clipped to norm C (behind the wall)."""
        eta, prec = self.local_sites(batch)
        sites = pack(eta, prec)
        # A record whose site overflowed (extreme input) contributes nothing, never NaN.
        sites = np.where(np.isfinite(sites).all(axis=1, keepdims=True), sites, 0.0)
        if self.clip is not None and len(sites):
            sites = sites * clip_factors(np.linalg.norm(sites, axis=1), self.clip)[:, None]
        return {SITE: sites.sum(axis=0) if len(sites) else np.zeros_like(self._site)}

    def release_bound(self, rho: float, normaliser: float) -> float:
        """C_rel = N s C / Z: one record's bound in the released natural parameters (see module doc).

        The replace-one sensitivity of one step's release is 2 * C_rel; the engine's noise
        multiplier z gives noise std z * C_rel on every packed released coordinate.
        """
        if self.clip is None:
            return math.inf
        return self.dataset_size * self.step_fraction(rho) * self.clip / positive("normaliser", normaliser)

    def release(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> np.ndarray:
        """The released posterior natural parameters (R), packed, before the precision projection."""
        m = np.asarray(noisy_mean[SITE], dtype=float)
        if m.shape != self._site.shape:
            raise ValueError(f"noisy mean {SITE!r} has shape {m.shape}, expected {self._site.shape}")
        if not np.all(np.isfinite(m)):
            raise ValueError(f"noisy mean {SITE!r} contains NaN or infinity")
        s = self.step_fraction(rho)
        return self._prior + self.dataset_size * ((1.0 - s) * self._site + s * m)

    @property
    def eigen_floor(self) -> float:
        """Eigenvalue floor of the posterior precision: public constants and the noise level only.

        The averaged site carries noise of variance v = sum_t w_t^2 std^2 per coordinate (w_t the
        blending weights of past steps), so each diagonal entry of N theta_f has noise std N sqrt(v)
        and the floor is floor_factor * sqrt(d) N sqrt(v). A diagonal (or isotropic) precision's
        entries are its eigenvalues, each with its own noise, so there the floor is
        floor_factor * N sqrt(v).
        """
        spread = 1.0 if self.diagonal else math.sqrt(self.dim)
        noise = self.dataset_size * spread * math.sqrt(self._noise_var)
        return max(self.precision_floor, self.floor_factor * noise)

    def update(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        """Damped site update, PD projection of the released precision, refreshed clipped site."""
        released = self.release(noisy_mean, rho)
        s = self.step_fraction(rho)
        self._noise_var = (1.0 - s) ** 2 * self._noise_var + s**2 * self.site_noise_std**2
        eta, prec = unpack(released, self.n_factors, self.dim, self.factor)
        floor = self.eigen_floor
        prec = np.maximum(prec, floor) if self.diagonal else np.stack([project_pd(p, floor) for p in prec])
        self._set_posterior(eta, prec)

    def _set_posterior(self, eta: np.ndarray, prec: np.ndarray) -> None:
        """theta_f = (theta - theta_0) / N, clipped to C; the posterior is theta_0 + N theta_f.

        With clip factor c in (0, 1] the posterior is (1 - c) theta_0 + c theta, a convex
        combination of PD precisions, so it stays PD; the cavity theta_0 + (N - 1) theta_f is
        likewise a convex combination of theta_0 and theta and stays PD.
        """
        site = (pack(eta, prec) - self._prior) / self.dataset_size
        if self.clip is not None:
            site = site * clip_factors(np.atleast_1d(np.linalg.norm(site)), self.clip)[0]
        self._site = site

    @property
    def site(self) -> np.ndarray:
        """The packed averaged site theta_f (a privatized, public quantity)."""
        return self._site.copy()

    def natural_parameters(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior natural parameters eta (K, d), prec (K, d, d) = theta_0 + N theta_f (the vector
        precision (K, d) or (K, 1) of a ``"diag"`` or ``"spherical"`` factor)."""
        return unpack(self._prior + self.dataset_size * self._site, self.n_factors, self.dim, self.factor)

    def cavity(self) -> tuple[np.ndarray, np.ndarray]:
        """Cavity natural parameters theta_0 + (N - 1) theta_f (posterior minus one site), shaped as
        :meth:`natural_parameters`."""
        return unpack(self._prior + (self.dataset_size - 1) * self._site, self.n_factors, self.dim, self.factor)

    def posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """Posterior means (K, d) and covariances (K, d, d)."""
        eta, prec = self.natural_parameters()
        if self.diagonal:
            return eta / prec, _diag_matrices(np.broadcast_to(1.0 / prec, eta.shape))
        cov = np.linalg.inv(prec)
        return np.einsum("kij,kj->ki", cov, eta), cov

    def state(self) -> dict[str, np.ndarray]:
        """Posterior natural parameters: ``eta`` (K, d) and ``prec`` (K, d, d) (diagonal matrices
        for a diagonal or isotropic factor: one message layout for every factor)."""
        eta, prec = self.natural_parameters()
        return {"eta": eta, "prec": _diag_matrices(np.broadcast_to(prec, eta.shape)) if self.diagonal else prec}

    def load_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore a published posterior (site re-derived and clipped as after an update)."""
        K, d = self.n_factors, self.dim
        try:
            eta = np.asarray(state["eta"], dtype=float)
            prec = np.asarray(state["prec"], dtype=float)
        except KeyError as exc:
            raise ValueError(f"state is missing natural parameter {exc.args[0]!r}") from None
        if eta.shape != (K, d) or prec.shape != (K, d, d):
            raise ValueError(f"state shapes eta {eta.shape}, prec {prec.shape}; expected {(K, d)}, {(K, d, d)}")
        if not (np.all(np.isfinite(eta)) and np.all(np.isfinite(prec))):
            raise ValueError("state contains NaN or infinity")
        if not np.allclose(prec, np.swapaxes(prec, -1, -2)) or np.any(np.linalg.eigvalsh(prec) <= 0):
            raise ValueError("state precision matrices must be symmetric positive definite")
        if self.diagonal:
            diag = np.diagonal(prec, axis1=-2, axis2=-1)
            if np.any(prec != _diag_matrices(diag)):
                raise ValueError("state precision matrices must be diagonal (the model's factors are)")
            if self.factor == "spherical" and np.any(diag != diag[:, :1]):
                raise ValueError("state precision matrices must be multiples of the identity (the model's "
                                 "factors are isotropic)")
            prec = diag[:, : self.width].copy()
        self._set_posterior(eta, prec)

    def hyperparameters(self) -> dict[str, Any]:
        """Public configuration shared by the SEP families."""
        return {
            "dataset_size": self.dataset_size,
            "clip": self.clip,
            "damping": self.damping,
            "prior_mean": self.prior_mean.tolist(),
            "prior_var": self.prior_var,
            "precision_floor": self.precision_floor,
            "floor_factor": self.floor_factor,
            "x_clip": self.x_clip,
            "max_abs": self.max_abs,
        }


def _diag_matrices(diagonals: np.ndarray) -> np.ndarray:
    """(K, d) diagonals -> (K, d, d) diagonal matrices."""
    return diagonals[..., :, None] * np.eye(diagonals.shape[-1])


def parse_vectors(objs: Sequence[Any], dim: int, x_clip: float | None, max_abs: float) -> tuple[FieldBatch, np.ndarray]:
    """Validate field ``x`` as ``dim`` finite numbers (|value| <= max_abs) and clip rows to ``x_clip``.

    Returns the :class:`FieldBatch` (for further fields, accepted indices and rejections) and the
    (n, dim) array with one row per input record (rows of rejected records are zero).
    """
    fields = FieldBatch(objs)
    x = fields.vector("x", dim, max_abs=max_abs)
    if x_clip is not None and len(x):
        x = x * clip_factors(np.linalg.norm(x, axis=1), x_clip)[:, None]
    return fields, x


# ------------------------------------------------------------------------- fit schedule

#: The SEP families' fit schedule, chosen for sep_bnn on synthetic data only (docs/sep_bnn.md,
#: "Fit rule") and shared by every SEP family: (Poisson rate q, steps T, site refreshes s T) for
#: private and non-private fits.
RULE_SCHEDULE = {"private": (0.01, 2000, 1.0), "non_private": (0.01, 2000, 20.0)}
#: Smallest expected batch (q is raised to this over N for small N).
RULE_MIN_BATCH = 10
#: rho_t = (tau0 + t)^-kappa, constant to about 0.01% over a run, so damping alone sets the step.
RULE_TAU0, RULE_KAPPA = 1e7, 0.51
#: C, the clip of every site: the DP-SEP paper's choice (its Appendix E found larger C worse at epsilon 1).
RULE_CLIP = 1.0


def site_schedule(n: int, private: bool) -> tuple[float, int, float, float, float]:
    """(q, T, s T, s, damping) of a SEP fit of N records: the schedule's q raised so that at least
    :data:`RULE_MIN_BATCH` records are expected per batch, its T and s T, the step s = s T / T and
    the damping that gives s under the nearly constant rho_t.

    The released natural parameters carry noise of std about C sqrt(2 s T) / mu per coordinate
    (mu: the Gaussian-DP level of (epsilon, delta)) whatever q and T, so the schedule fixes the
    product s T (the site refreshes) and lets q and T serve stability and cost.

    >>> q, T, sT, s, damping = site_schedule(500, private=True)
    >>> q, T, sT, s
    (0.02, 2000, 1.0, 0.0005)
    """
    from stream_vips.schedule import step_size

    q, steps, refreshes = RULE_SCHEDULE["private" if private else "non_private"]
    q = min(1.0, max(q, RULE_MIN_BATCH / n))
    step = refreshes / steps
    return q, steps, refreshes, step, step / step_size(0, RULE_TAU0, RULE_KAPPA)


def site_rule(n: int, d: int, epsilon: float | None, delta: float, model_params: Mapping[str, Any],
              why: Mapping[str, str]) -> dict[str, Any]:
    """The fit rule of a SEP family that takes the shared schedule as it is (sep_mixture,
    sep_probit), as a mapping (:func:`stream_vips.fitting.rules.settings_from_rule`): the schedule
    of :func:`site_schedule`, the clip :data:`RULE_CLIP`, ``dim`` d, ``dataset_size`` N, the
    family's ``model_params`` and the reasons, the family's ``why`` among them."""
    private = epsilon is not None
    q, steps, refreshes, step, damping = site_schedule(integer("n", n), private)
    reasons = {
        "q": (f"q = {q:g}: the SEP families' Poisson rate (at least {RULE_MIN_BATCH} records expected per batch), "
              "chosen for sep_bnn on synthetic data (docs/sep_bnn.md): many small steps linearise fewer records "
              "at one cavity; not re-chosen for this family"),
        "steps": f"{steps} steps ({q * steps:g} epochs): enough for the site to settle at s T = {refreshes:g}",
        "step": (f"s = {step:.4g} per step (s T = {refreshes:g} site refreshes): "
                 + ("the noise on the released natural parameters grows like sqrt(s T) whatever q and T, and "
                    "1 refresh was sep_bnn's best on synthetic data" if private else
                    "no noise, so as many refreshes as converge (sep_bnn's choice without noise)")),
        "tau0_kappa": f"tau0 = {RULE_TAU0:g}, kappa = {RULE_KAPPA}: rho_t constant to about 0.01% over the run",
        "clip": (f"C = {RULE_CLIP}: the DP-SEP paper's choice; records are used at their own scale (no x_clip): "
                 "the clip bounds every site whatever x is"),
        **why,
    }
    return {"q": q, "steps": steps, "tau0": RULE_TAU0, "kappa": RULE_KAPPA,
            "model_params": {"dim": integer("d", d), "clip": RULE_CLIP, "damping": damping, "dataset_size": n,
                             **model_params},
            "why": reasons}
