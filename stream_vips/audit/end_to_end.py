"""Releases of the whole pipeline: source -> decode -> validate -> reservoir -> engine step.

:mod:`stream_vips.audit.release` audits one ``PrivateEngine.step()`` on a hand-built reservoir.
This module audits what a deployed :class:`~stream_vips.service.app.Application` releases: the
audited record arrives through the configured source (Kafka in ``tests/test_audit_kafka.py``),
is decoded, validated and offered to the reservoir by the pipeline, and every release is the
pipeline's own step. Anything between the stream and the reservoir that counts a record twice
(a source that re-reads after a rebalance, a pipeline that forgets its offsets) changes the
reservoir the steps sample from, so it shows in the releases, which an accountant test never
sees.

Why many steps from one reservoir, not one reservoir per trial. The reservoir is Algorithm R:
after ``t`` arrivals a new record enters with probability ``M / t``, so a long stream cannot be
cut into short episodes that each refill it. Instead one stream fills the reservoir of ``M``
slots exactly (``M`` records: the audited one and ``M - 1`` fillers whose contribution is zero),
and steps are then triggered by time (``schedule.every_seconds``), with the whole reservoir as
the batch (fixed-size sampling, ``S = M``, so ``q = 1``). Each step draws fresh noise from the
engine's generator, and the model's ``update`` is replaced on the instance by a recorder
(:class:`ReleaseCapture`), as :class:`~stream_vips.audit.release.EngineTrials` does, so the state
never moves: every step is an independent release of the same reservoir, one trial. With the
two sides' streams differing only in the audited record, reservoir membership is the same on
both (positions below ``M`` fill their own slot), so the sides are a replace-one pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from stream_vips.audit.release import flatten

#: The time trigger of an audit run: a step on every idle loop iteration once the reservoir is full.
STEP_EVERY_S = 1e-6
#: Budget of an audit run: the monitor must admit every trial (it gates, never shapes, a release).
AUDIT_EPSILON = 1e300


def filler_record(dim: int) -> dict[str, Any]:
    """A linreg record whose clipped contribution is zero in every block (x = 0, y = 0)."""
    return {"x": [0.0] * dim, "y": 0.0}


def linreg_audit_config(*, source: Mapping[str, Any], capacity: int, noise_multiplier: float, seed: int,
                        x_bound: float, y_bound: float, dim: int = 2,
                        checkpoint_path: str | None = None) -> dict[str, Any]:
    """Configuration of a linreg pipeline whose steps are audit trials (see the module docstring).

    ``source`` is the ``source`` section (type and options). Fixed-size batches of the whole
    reservoir (q = 1), time-triggered steps, a seeded generator (the sides of a pair get
    different seeds: independent noise; membership below ``capacity`` does not depend on it), a
    cheap gating accountant with an unreachable budget (the claim is computed separately by
    :func:`~stream_vips.audit.release.claimed_epsilon`), in-memory sinks, and one model message
    at the first and the last step only (publishing costs an accountant evaluation).
    """
    cfg: dict[str, Any] = {
        "model": {"family": "linreg", "id": "audit",
                  "params": {"dim": dim, "dataset_size": capacity, "x_bound": x_bound, "y_bound": y_bound}},
        "privacy": {"epsilon": AUDIT_EPSILON, "delta": 1e-5, "noise_multiplier": noise_multiplier,
                    "accountant": "strong", "seed": seed, "ledger": {"type": "memory"}},
        "sampling": {"method": "fixed", "reservoir": capacity, "batch_size": capacity},
        "schedule": {"every_seconds": STEP_EVERY_S, "tau0": 1.0, "kappa": 1.0},
        "source": dict(source),
        "sink": {"type": "memory"},
        "dead_letter": {"type": "memory"},
        "metrics": {"enabled": False},
        "runtime": {"on_halt": "exit", "poll_timeout_s": 0.05, "publish_interval_s": 3600.0},
    }
    if checkpoint_path is not None:
        cfg["runtime"].update(checkpoint_path=checkpoint_path, checkpoint_interval_s=0.0)
    return cfg


class ReleaseCapture:
    """Records every privatized statistic an :class:`~stream_vips.service.app.Application` releases.

    Replaces ``app.model.update`` on the instance (the model never learns, so every step
    releases from the same state) and keeps each noisy mean, flattened as the engine audit does,
    with the stream position (``reservoir.seen``) it was released at. ``app.progress`` stops the
    run once ``n`` releases share the latest position, and polls without waiting once the
    reservoir is full (a step per loop iteration; before that the loop waits for records).
    """

    def __init__(self, app: Any, n: int) -> None:
        self.app = app
        self.n = int(n)
        self.blocks = tuple(app.model.blocks())
        self._releases: list[np.ndarray] = []
        self._position: int | None = None  # stream position of the latest release
        self._first = 0  # index of the first release made at that position
        app.model.update = self._record  # type: ignore[method-assign]
        app.progress = self._progress

    def _record(self, noisy_mean: Mapping[str, np.ndarray], rho: float) -> None:
        seen = self.app.reservoir.seen
        if seen != self._position:
            self._position, self._first = seen, len(self._releases)
        self._releases.append(flatten(noisy_mean, self.blocks))

    def _progress(self, app: Any) -> None:
        app.poll_timeout_s = 0.0 if app.reservoir.full else 0.05
        if len(self._releases) - self._first >= self.n:
            app.stop()

    def releases(self) -> np.ndarray:
        """The releases made at the latest stream position (earlier ones saw a reservoir that
        later arrivals changed), in order, at most ``n``."""
        return np.array(self._releases[self._first:self._first + self.n])

    @property
    def position(self) -> int | None:
        """The stream position of the latest release."""
        return self._position

    @property
    def total(self) -> int:
        """Every release made, whatever its position."""
        return len(self._releases)


def copies_in_reservoir(app: Any, record: Mapping[str, Any]) -> int:
    """How many reservoir slots hold ``record`` (after the model's parsing and clipping)."""
    parsed = app.model.parse_batch([dict(record)])
    if len(parsed.accepted) != 1:
        raise ValueError(f"{record!r} is rejected by the model: {parsed.rejected}")
    cols, valid = app.reservoir.columns, app.reservoir.valid
    same = valid.copy()
    for name, value in parsed.rows.items():
        same &= np.all(np.asarray(cols[name]).reshape(len(valid), -1) == np.asarray(value).reshape(1, -1), axis=1)
    return int(np.count_nonzero(same))
