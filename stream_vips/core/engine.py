"""One private update step: sample, clip, check the budget, write the ledger, noise once, M-step.

A step is two calls with a typed value between them, split at the privacy wall:
:meth:`PrivateEngine.contribution` samples the reservoir and sums the sampled records' clipped
per-block contributions (pure: no noise, no ledger; the :class:`Contribution` never leaves the
process's trusted part), and :meth:`PrivateEngine.release` checks the budget, writes the ledger,
draws the noise once, divides by the public normaliser and runs the M-step. Contributions of
disjoint parts of a reservoir add up (:meth:`Contribution.plus`) to the contribution of the whole,
so several machines can each sum their part and one place release the total.
:meth:`PrivateEngine.step` is the two in one process.

The order inside :meth:`PrivateEngine.step` is the privacy argument (privacy rules 3-7 in docs/privacy.md):

1. refuse unless the reservoir is full (privacy rule 5: q and the normaliser assume exactly M records);
2. draw a fresh batch from the sampler and let the model sum its clipped per-record
   contributions (behind the wall: nothing computed here leaves the engine);
3. describe the release as a :class:`SubsampledGaussianEvent` built from configuration only
   (z, q, sampling, replace-one adjacency, the model's diameter) and hand it to the budget
   monitor, which checks epsilon as if the event had happened and appends it durably to the
   ledger; a refusal halts the engine and nothing is released;
4. only then draw the noise, once per block, with std_k = z * C_k / a_k, which is one Gaussian
   mechanism with noise multiplier z on the joint bound (privacy rule 6); symmetric blocks use
   Analyze-Gauss noise;
5. divide by the public normaliser (S, or q*M for Poisson; privacy rule 4) and run the model's M-step
   with rho_t = (tau0 + t)^-kappa, t = the ledger step (post-processing).

``non_private=True`` (configuration ``privacy.mode: non_private``) is the only way to run with
z = 0: no events, no ledger, epsilon reported as infinite, and the report never claims privacy
(``delta`` is then only echoed into the report).

>>> from stream_vips.models.linreg import LinearRegression
>>> from stream_vips.privacy.accountants import make_accountant
>>> from stream_vips.privacy.budget import BudgetMonitor
>>> from stream_vips.privacy.ledger import MemoryLedger
>>> from stream_vips.core.data.reservoir import Reservoir
>>> from stream_vips.core.data.sampling import make_sampler
>>> model = LinearRegression(dim=2, dataset_size=100)
>>> rng = np.random.default_rng(0)
>>> reservoir = Reservoir(model.row_layout(), 100, rng)
>>> reservoir.add_batch({"x": rng.uniform(-0.5, 0.5, (100, 2)), "y": rng.uniform(-1, 1, 100)})
>>> ledger = MemoryLedger()
>>> monitor = BudgetMonitor(10.0, 1e-5, make_accountant("auto", "fixed"), ledger)
>>> engine = PrivateEngine(model, reservoir, make_sampler("fixed", 50, 100), monitor, noise_multiplier=5.0,
...                        rng=rng, tau0=10.0, kappa=0.7, accountant_name="rdp")
>>> result = engine.step()
>>> result.step, len(ledger.events()), engine.event() == ledger.events()[0]
(0, 1, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stream_vips import messages
from stream_vips.core.data.protocols import AnyReservoir
from stream_vips.core.data.sampling import Sampler
from stream_vips.errors import ReservoirNotFull
from stream_vips.models.base import Block, Model
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import Ledger
from stream_vips.privacy.mechanisms import block_noise_stds, gaussian_noise, symmetric_noise
from stream_vips.schedule import step_size

ADJACENCY = "replace_one"
#: Privacy units: a record (privacy rule 1) or all records of one key (privacy rule 12).
UNITS = ("record", "key")


@dataclass(frozen=True)
class StepResult:
    """What one released step produced: its index (= ledger step = message version), the step
    size and the duration. The privacy report is built on demand (:meth:`PrivateEngine.privacy_report`)
    because evaluating epsilon can cost far more than the step itself (PLD accounting)."""

    step: int
    rho: float
    duration_s: float


class Monitor(Protocol):
    """What the engine needs of the budget monitor
    (:class:`~stream_vips.privacy.budget.BudgetMonitor`): the budget, whether it halted, the
    spent epsilon, and the admission that makes a step's event durable before its noise."""

    epsilon_budget: float
    delta: float
    halted: bool
    window: int | None

    @property
    def ledger(self) -> Ledger: ...

    def spent(self) -> float: ...

    def admit(self, event: SubsampledGaussianEvent, position: int | None = None) -> int | None: ...


@dataclass(frozen=True)
class Contribution:
    """What the sampled records contribute to one step, before any noise: per block, the sum of
    their clipped contributions (``sums``, behind the privacy wall), and the stream position the
    step is taken at (public). Summable over disjoint parts of the reservoir."""

    sums: Mapping[str, np.ndarray]
    position: int

    def plus(self, other: Contribution) -> Contribution:
        """The contribution of both parts together (the same step: equal positions)."""
        if other.position != self.position or set(other.sums) != set(self.sums):
            raise ValueError("contributions of different steps or blocks do not add up")
        return Contribution({name: self.sums[name] + other.sums[name] for name in self.sums}, self.position)


def allocation_weights(blocks: Sequence[Block], block_weights: Mapping[str, float] | None) -> dict[str, float]:
    """The noise allocation a_k per block, normalised to sum a_k^2 = 1 (default: a_k
    proportional to the block's bound C_k, i.e. noise z on the concatenated vector)."""
    names = [b.name for b in blocks]
    if block_weights is None:
        w = np.array([float(b.bound) for b in blocks])
    else:
        missing = set(names) ^ set(block_weights)
        if missing:
            raise ValueError(f"block_weights must name exactly the blocks {names}, mismatch: {sorted(missing)}")
        w = np.array([float(block_weights[n]) for n in names])
        if np.any(~(w > 0)):
            raise ValueError(f"block_weights must be > 0, got {dict(block_weights)}")
    if not np.all(np.isfinite(w)) or np.any(~(w > 0)):  # unbounded blocks: refused by the engine
        return {n: 1.0 / math.sqrt(len(names)) for n in names}
    w = w / np.linalg.norm(w)
    return dict(zip(names, map(float, w)))


def allocation_diameter(model: Model, block_weights: Mapping[str, float] | None = None,
                        unit: str = "record") -> float:
    """The model's replace-one diameter (in units of the joint bound) for the noise allocation
    the engine will actually use: a model that proves a tighter bound for a given allocation
    (logistic regression) gets it, and accounting and calibration use the same number. With
    ``unit="key"`` it is the diameter of the per-key clipped sums (privacy rule 12)."""
    chosen = block_weights if block_weights is not None else model.default_block_weights()
    weights = allocation_weights(model.blocks(), chosen)
    if unit == "key":
        return float(model.group_diameter(weights))
    return float(model.diameter(weights))


class PrivateEngine:
    """Runs private steps of ``model`` on batches drawn from ``reservoir``.

    ``monitor`` is a :class:`stream_vips.privacy.budget.BudgetMonitor` (``None`` only when
    ``non_private``); ``rng`` draws both the batches and the noise; ``block_weights`` are
    relative allocation weights a_k per block name (normalised to sum a_k^2 = 1; default
    a_k proportional to C_k); ``seeded`` says whether ``rng`` came from a fixed seed (privacy rule 9).
    ``unit="key"`` (privacy rule 12) draws key slots from a
    :class:`~stream_vips.core.data.key_reservoir.KeyReservoir` and sums the model's per-key clipped
    contributions (``group_clipped_sum``); the event is the same, with the key slot as the
    population member.
    """

    def __init__(
        self,
        model: Model,
        reservoir: AnyReservoir,
        sampler: Sampler,
        monitor: Monitor | None,
        noise_multiplier: float,
        rng: np.random.Generator,
        tau0: float,
        kappa: float,
        accountant_name: str,
        block_weights: Mapping[str, float] | None = None,
        seeded: bool = False,
        non_private: bool = False,
        delta: float = 1e-5,
        rho_min: float = 0.0,
        unit: str = "record",
    ) -> None:
        z = float(noise_multiplier)
        if unit not in UNITS:
            raise ValueError(f"privacy.unit must be one of {UNITS}, got {unit!r}")
        if unit == "key" and not model.supports_key_unit:
            raise ValueError(f"privacy.unit: key is not supported by the {model.family} family: {model.key_unit_note}")
        if (unit == "key") != (getattr(reservoir, "unit", "record") == "key"):
            raise ValueError(f"privacy.unit {unit!r} needs a {'KeyReservoir' if unit == 'key' else 'Reservoir'}")
        self.unit = unit
        if non_private:
            if z != 0.0 or monitor is not None:
                raise ValueError("non_private mode runs with noise_multiplier 0 and no budget monitor")
        elif not (math.isfinite(z) and z > 0):
            raise ValueError(
                f"noise_multiplier must be > 0 (got {noise_multiplier!r}); z = 0 needs privacy.mode: non_private"
            )
        elif monitor is None:
            raise ValueError("a private engine needs a budget monitor")
        else:
            model.check_noise_multiplier(z)
        self.model = model
        self.reservoir = reservoir
        self.sampler = sampler
        self.monitor = monitor
        self.noise_multiplier = z
        self.rng = rng
        self.tau0 = float(tau0)
        self.kappa = float(kappa)
        self.rho_min = float(rho_min)
        self.accountant_name = accountant_name
        self.seeded = bool(seeded)
        self.non_private = bool(non_private)
        self.delta = float(delta)  # only reported by non-private runs; private ones use the monitor's
        self.blocks = tuple(model.blocks())
        if block_weights is None:
            block_weights = model.default_block_weights()  # the family's own allocation rule, if any
        self._stds = self._block_stds(block_weights)
        self.diameter = allocation_diameter(model, block_weights, unit)
        self._local_steps = 0  # non-private mode has no ledger to count steps
        self.last_step: int | None = None
        capacity = reservoir.capacity
        self.q = float(sampler.rate(capacity))
        self.normaliser = float(sampler.normaliser(capacity))
        model.set_noise_scale({name: std / self.normaliser for name, std in self._stds.items()})

    def _block_stds(self, block_weights: Mapping[str, float] | None) -> dict[str, float]:
        names = [b.name for b in self.blocks]
        bounds = [b.bound for b in self.blocks]
        allocation = allocation_weights(self.blocks, block_weights)
        weights = None if block_weights is None else [allocation[n] for n in names]
        if self.non_private:
            return {n: 0.0 for n in names}
        unbounded = [b.name for b in self.blocks if not (math.isfinite(b.bound) and b.bound > 0)]
        if unbounded:
            raise ValueError(f"blocks {unbounded} have no finite per-record bound (no clipping): "
                             "a private run needs one; only privacy.mode: non_private runs unclipped")
        stds = block_noise_stds(self.noise_multiplier, bounds, weights)
        return dict(zip(names, map(float, stds)))

    @property
    def block_stds(self) -> dict[str, float]:
        """Noise std added to each block's batch sum (before normalisation)."""
        return dict(self._stds)

    @property
    def halted(self) -> bool:
        return bool(self.monitor is not None and self.monitor.halted)

    def epsilon_spent(self) -> float:
        return math.inf if self.non_private else float(self.monitor.spent())

    def event(self) -> SubsampledGaussianEvent:
        """The privacy event of one step; built from configuration only."""
        return SubsampledGaussianEvent(
            noise_multiplier=self.noise_multiplier,
            sampling_rate=self.q,
            sampling=self.sampler.name,
            adjacency=ADJACENCY,
            diameter=self.diameter,
            privacy_unit=self.unit,
        )

    def privacy_report(self, steps: int, halted: bool) -> dict[str, Any]:
        """The ``privacy`` object of a model message after ``steps`` releases, with the epsilon
        of the whole ledger (so call it for the latest step).

        A non-private run reports infinite epsilon and budget, accountant ``"none"`` and z = 0:
        it never claims a guarantee (and strict JSON sinks refuse to carry it).
        """
        private = not self.non_private
        return messages.privacy_report(
            epsilon_spent=self.epsilon_spent(),
            delta=self.monitor.delta if private else self.delta,
            epsilon_budget=self.monitor.epsilon_budget if private else math.inf,
            accountant=self.accountant_name if private else "none",
            sampling=self.sampler.name,
            q=self.q,
            noise_multiplier=self.noise_multiplier,
            steps=steps,
            halted=halted,
            seeded=self.seeded,
            adjacency=ADJACENCY,
            diameter=self.diameter,
            ledger_id=self.monitor.ledger.ledger_id if private else None,
            private=private,
            window_steps=self.monitor.window if private else None,
            unit=self.unit,
            max_records_per_key=self.reservoir.max_records_per_key if self.unit == "key" else None,
        )

    def _noisy_mean(self, sums: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = {}
        for block in self.blocks:
            total = np.asarray(sums[block.name], dtype=float)
            if total.shape != tuple(block.shape):
                raise ValueError(f"clipped_sum block {block.name!r} has shape {total.shape}, declared {block.shape}")
            std = self._stds[block.name]
            if std > 0:
                if block.symmetric:
                    total = total + symmetric_noise(self.rng, block.shape[0], std)
                else:
                    total = total + gaussian_noise(self.rng, block.shape, std)
            out[block.name] = total / self.normaliser
        return out

    def step(self) -> StepResult | None:
        """Run one private step (:meth:`contribution`, then :meth:`release`); ``None`` when the
        budget refuses it (the engine is then halted).

        Raises :class:`ReservoirNotFull` before the reservoir holds M records.
        """
        if self.halted:
            return None
        started = time.perf_counter()
        return self.release(self.contribution(), started)

    def contribution(self) -> Contribution:
        """Sample the reservoir and sum the sampled records' clipped contributions per block
        (behind the wall: nothing here is noised, charged or released).

        Raises :class:`ReservoirNotFull` before the reservoir holds M records (privacy rule 5).
        """
        if not self.reservoir.full:
            raise ReservoirNotFull(
                f"reservoir holds {self.reservoir.size} of {self.reservoir.capacity} records; no release until full"
            )
        capacity = self.reservoir.capacity
        idx = self.sampler.sample(self.reservoir.size, self.rng, capacity=capacity)
        if self.unit == "key":  # privacy rule 12: idx are key slots; sum per key, clip, then add
            rows, groups, n_groups = self.reservoir.take_groups(idx)
            sums = self.model.group_clipped_sum(rows, groups, n_groups)
        else:
            sums = self.model.clipped_sum(self.reservoir.take(idx))
        if set(sums) != {b.name for b in self.blocks}:
            raise ValueError(f"clipped_sum returned blocks {sorted(sums)}, "
                             f"model declares {[b.name for b in self.blocks]}")
        return Contribution(sums, self.reservoir.seen)

    def release(self, contribution: Contribution, started: float | None = None) -> StepResult | None:
        """Release one step of ``contribution``: the budget check and the durable ledger entry
        first, then one noise draw per block, the public normaliser and the M-step
        (post-processing). ``None`` when the budget refuses it (the engine is then halted)."""
        if self.halted:
            return None
        started = time.perf_counter() if started is None else started
        if self.non_private:
            step = self._local_steps
            self._local_steps += 1
        else:
            step = self.monitor.admit(self.event(), position=contribution.position)  # durable, before noise
            if step is None:
                return None
        rho = max(self.rho_min, step_size(step, self.tau0, self.kappa))  # the floor follows drift
        self.model.update(self._noisy_mean(contribution.sums), rho)
        self.last_step = step
        return StepResult(step=step, rho=rho, duration_s=time.perf_counter() - started)
