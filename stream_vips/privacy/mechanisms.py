"""Clipping, noise and projection: the numerical side of a private release.

Everything here is vectorized over the batch. Noise conventions follow privacy rule 2 in
docs/privacy.md: the noise multiplier z is noise std / C, where C bounds one record's L2
contribution, so the std added to a sum is ``noise_std(z, C) = z * C`` and to a mean of S records
``z * C / S``.

>>> rng, seeded = make_rng(0)
>>> clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0).round(3).tolist()
[[0.6, 0.8], [0.3, 0.4]]
>>> effective_noise_multiplier([1.0, 2.0], block_noise_stds(1.5, [1.0, 2.0]))
1.5
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def make_rng(seed: int | None = None) -> tuple[np.random.Generator, bool]:
    """A noise generator and whether it was seeded (privacy rule 9 in docs/privacy.md).

    ``seed=None`` draws the seed from OS entropy (production). A fixed seed is for tests, demos
    and reproduction only; the returned flag must end up in the privacy report.
    """
    if seed is None:
        return np.random.default_rng(np.random.SeedSequence()), False
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer or None, got {seed!r}")
    return np.random.default_rng(int(seed)), True


def clip_factors(norms: np.ndarray, bound: float) -> np.ndarray:
    """Per-row scale factors min(1, C / ||x||) that bring each norm to at most ``bound``.

    Works from norms alone so callers with sparse or structured rows (never materialised as a
    dense matrix) clip with the same rule. Zero rows keep factor 1.
    """
    if not bound > 0:
        raise ValueError(f"clip bound must be > 0, got {bound!r}")
    norms = np.asarray(norms, dtype=float)
    if np.any(norms < 0) or not np.all(np.isfinite(norms)):
        raise ValueError("norms must be finite and non-negative")
    return np.minimum(1.0, bound / np.maximum(norms, np.finfo(float).tiny))


def clip_rows(X: np.ndarray, bound: float) -> np.ndarray:
    """Rows of ``X`` (n x d) scaled so that each has L2 norm <= ``bound`` (a new array)."""
    X = np.asarray(X, dtype=float)
    if X.ndim != 2:
        raise ValueError(f"clip_rows expects a 2-d array, got shape {X.shape}")
    return X * clip_factors(np.linalg.norm(X, axis=1), bound)[:, None]


def noise_std(noise_multiplier: float, bound: float) -> float:
    """Noise std for a sum whose per-record contributions have L2 norm <= ``bound``: z * C."""
    if not noise_multiplier > 0 or not bound > 0:
        raise ValueError(f"noise multiplier and bound must be > 0, got {noise_multiplier!r}, {bound!r}")
    return float(noise_multiplier) * float(bound)


def block_noise_stds(
    noise_multiplier: float, bounds: Sequence[float], weights: Sequence[float] | None = None
) -> np.ndarray:
    """Noise stds for K blocks released together as one Gaussian mechanism (privacy rule 6 in
    docs/privacy.md).

    One record contributes (c_1, ..., c_K) with ||c_k|| <= C_k. Adding N(0, s_k^2) to block k is
    the same as scaling block k by 1/s_k and adding unit noise; the scaled record has norm at
    most sqrt(sum_k C_k^2 / s_k^2), so the joint release has noise multiplier
    ``effective_noise_multiplier(bounds, stds)`` = (sum_k C_k^2 / s_k^2)^(-1/2). With allocation
    weights a_k (sum a_k^2 = 1) and s_k = z * C_k / a_k that is exactly z. The default
    a_k = C_k / sqrt(sum_j C_j^2) gives every block s_k = z * sqrt(sum_j C_j^2), i.e. noise z on
    the concatenated vector.
    """
    C = np.asarray(bounds, dtype=float)
    if C.ndim != 1 or C.size == 0 or np.any(~(C > 0)):
        raise ValueError(f"bounds must be a non-empty list of positive numbers, got {bounds!r}")
    a = C / np.linalg.norm(C) if weights is None else np.asarray(weights, dtype=float)
    if a.shape != C.shape or np.any(~(a > 0)) or not np.isclose(np.sum(a**2), 1.0):
        raise ValueError(f"weights must be positive, one per block, with sum of squares 1, got {weights!r}")
    return noise_std(noise_multiplier, 1.0) * C / a


def effective_noise_multiplier(bounds: Sequence[float], stds: Sequence[float]) -> float:
    """Noise multiplier of the joint release of blocks: (sum_k C_k^2 / s_k^2)^(-1/2)."""
    C = np.asarray(bounds, dtype=float)
    s = np.asarray(stds, dtype=float)
    if C.shape != s.shape or np.any(~(C > 0)) or np.any(~(s > 0)):
        raise ValueError("bounds and stds must be positive and of equal length")
    return float(np.sum((C / s) ** 2) ** -0.5)


def gaussian_noise(rng: np.random.Generator, shape: int | tuple[int, ...], std: float) -> np.ndarray:
    """I.i.d. N(0, std^2) noise of the given shape."""
    if not std >= 0 or not np.isfinite(std):
        raise ValueError(f"noise std must be finite and >= 0, got {std!r}")
    return rng.normal(0.0, std, size=shape)


def symmetric_noise(rng: np.random.Generator, d: int, std: float) -> np.ndarray:
    """Symmetric d x d noise for a symmetric statistic (Analyze Gauss).

    A record's symmetric contribution A (e.g. x x^T) with ||A||_F <= C is released through the
    vector v(A) = (A_ii for all i, sqrt(2) * A_ij for i < j). This map is linear and
    ||v(A)||_2^2 = sum_i A_ii^2 + 2 sum_{i<j} A_ij^2 = ||A||_F^2, so v has the same per-record
    L2 bound C, and adding N(0, std^2) to each entry of v is a Gaussian mechanism with noise
    multiplier std / C. Mapped back, the diagonal gets noise std ``std`` and each off-diagonal
    pair (i, j), (j, i) gets the same draw with std ``std / sqrt(2)``: sqrt(2) less noise
    off the diagonal than noising the upper triangle of A directly, at the same privacy.
    """
    if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
        raise ValueError(f"d must be a positive integer, got {d!r}")
    scale = np.full((d, d), std / np.sqrt(2.0))
    np.fill_diagonal(scale, std)
    E = np.triu(gaussian_noise(rng, (d, d), 1.0) * scale)
    return E + np.triu(E, 1).T


def project_pd(S: np.ndarray, floor: float) -> np.ndarray:
    """Nearest (Frobenius) symmetric matrix to ``S`` with all eigenvalues >= ``floor`` > 0.

    Applied after noise (post-processing, privacy rule 8 in docs/privacy.md); ``floor`` must be set
    from public quantities such as the expected noise spectral norm, never from the data.
    """
    S = np.asarray(S, dtype=float)
    if S.ndim != 2 or S.shape[0] != S.shape[1]:
        raise ValueError(f"project_pd expects a square matrix, got shape {S.shape}")
    if not floor > 0 or not np.isfinite(floor):
        raise ValueError(f"eigenvalue floor must be finite and > 0, got {floor!r}")
    w, V = np.linalg.eigh((S + S.T) / 2.0)
    P = (V * np.maximum(w, floor)) @ V.T
    return (P + P.T) / 2.0
