"""PrivateEngine: refuse before the reservoir is full, check and write the ledger before any
noise, noise once per block with std_k = z C_k / a_k (one mechanism with multiplier z, privacy
rule 6 in docs/privacy.md), divide by the public normaliser, rho_t from the ledger step, honest
privacy reports."""

from __future__ import annotations

import math

import numpy as np
import pytest

import stream_vips.core.engine as engine_mod
from stream_vips.core.data.key_reservoir import KeyReservoir
from stream_vips.core.data.reservoir import Reservoir
from stream_vips.core.data.sampling import FixedSizeSampler, PoissonSampler
from stream_vips.core.engine import PrivateEngine, allocation_diameter, allocation_weights
from stream_vips.errors import ReservoirNotFull
from stream_vips.models.base import Block, Model, ParsedBatch
from stream_vips.privacy.accountants import PldAccountant, RdpAccountant
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.events import SubsampledGaussianEvent
from stream_vips.privacy.ledger import MemoryLedger
from stream_vips.privacy.mechanisms import effective_noise_multiplier


class FakeModel(Model):
    """Blocks of chosen shapes and bounds; each record contributes its ``v`` value to every
    entry of every block (scaled so the per-record bound holds), so exact sums are known."""

    family = "fake"

    def __init__(self, blocks: tuple[Block, ...], diameter: float = 2.0) -> None:
        self._blocks = blocks
        self._diameter = diameter
        self.updates: list[tuple[dict[str, np.ndarray], float]] = []
        self.batches: list[dict[str, np.ndarray]] = []

    def row_layout(self):
        return {"v": (np.dtype(np.float64), ())}

    def parse_batch(self, objs):
        v = np.array([o["v"] for o in objs], dtype=float)
        return ParsedBatch({"v": v}, np.arange(len(objs)))

    def blocks(self):
        return self._blocks

    def diameter(self, weights=None):
        return self._diameter

    def clipped_sum(self, batch):
        self.batches.append(dict(batch))
        v = np.clip(batch["v"], -1.0, 1.0)
        return {b.name: np.full(b.shape, v.sum() * b.bound / math.sqrt(max(1, int(np.prod(b.shape)))))
                for b in self._blocks}

    def update(self, noisy_mean, rho):
        self.updates.append(({k: np.array(v) for k, v in noisy_mean.items()}, rho))

    def state(self):
        return {}

    def load_state(self, state):
        pass

    def hyperparameters(self):
        return {}


class AdmitAll:
    """A budget monitor double that admits everything (for noise statistics over many steps)."""

    epsilon_budget = 1.0
    delta = 1e-5
    halted = False
    halt_reason = None

    def __init__(self) -> None:
        self.events: list[SubsampledGaussianEvent] = []

    def admit(self, event, position=None):
        self.events.append(event)
        return len(self.events) - 1

    def spent(self):
        return 0.5


def full_reservoir(capacity: int, value: float = 0.5, seed: int = 0) -> Reservoir:
    res = Reservoir({"v": (np.float64, ())}, capacity, np.random.default_rng(seed))
    res.add_batch({"v": np.full(capacity, value)})
    return res


def make_engine(model, reservoir, sampler, monitor, z=1.0, **kw) -> PrivateEngine:
    kw.setdefault("tau0", 10.0)
    kw.setdefault("kappa", 0.7)
    return PrivateEngine(model, reservoir, sampler, monitor, z, np.random.default_rng(kw.pop("seed", 1)),
                         accountant_name=kw.pop("accountant_name", "fake"), **kw)


BLOCKS = (Block("vec", (400,), 1.0), Block("sym", (20, 20), 2.0, symmetric=True), Block("scalar", (), 0.5))


@pytest.mark.parametrize("weights", [None, {"vec": 1.0, "sym": 3.0, "scalar": 0.5}])
def test_noise_std_per_block_is_z_C_over_a(weights):
    z, M = 1.7, 50
    model = FakeModel(BLOCKS)
    res = full_reservoir(M, value=0.0)  # zero contributions: the released means are pure noise
    sampler = FixedSizeSampler(10)
    eng = make_engine(model, res, sampler, AdmitAll(), z=z, block_weights=weights, tau0=1.0)
    C = np.array([b.bound for b in BLOCKS])
    if weights is None:
        a = C / np.linalg.norm(C)
    else:
        w = np.array([weights[b.name] for b in BLOCKS])
        a = w / np.linalg.norm(w)
    expected = z * C / a
    assert effective_noise_multiplier(C, expected) == pytest.approx(z, rel=1e-12)
    assert [eng.block_stds[b.name] for b in BLOCKS] == pytest.approx(expected, rel=1e-12)

    steps = 300
    for _ in range(steps):
        eng.step()
    norm = sampler.normaliser(M)
    noise = {b.name: np.stack([u[0][b.name] for u in model.updates]) * norm for b in BLOCKS}
    # vec: steps * 400 iid draws; the sample std has relative sd ~ 1/sqrt(2n). Allow 5 of those.
    n = steps * 400
    assert noise["vec"].std() == pytest.approx(expected[0], rel=5 / math.sqrt(2 * n))
    # scalar: 300 draws.
    assert np.sqrt(np.mean(noise["scalar"] ** 2)) == pytest.approx(expected[2], rel=5 / math.sqrt(2 * steps))
    # symmetric (Analyze-Gauss): exactly symmetric, diagonal std s, off-diagonal std s/sqrt(2).
    sym = noise["sym"]
    assert np.array_equal(sym, np.swapaxes(sym, 1, 2))
    diag = np.diagonal(sym, axis1=1, axis2=2)
    off = sym[:, *np.triu_indices(20, 1)]
    assert np.sqrt(np.mean(diag**2)) == pytest.approx(expected[1], rel=5 / math.sqrt(2 * diag.size))
    assert np.sqrt(np.mean(off**2)) == pytest.approx(expected[1] / math.sqrt(2), rel=5 / math.sqrt(2 * off.size))


def test_refuses_until_the_reservoir_is_full():
    model = FakeModel(BLOCKS)
    res = Reservoir({"v": (np.float64, ())}, 10, np.random.default_rng(0))
    res.add_batch({"v": np.ones(9)})
    monitor = AdmitAll()
    eng = make_engine(model, res, PoissonSampler(0.5), monitor)
    with pytest.raises(ReservoirNotFull):
        eng.step()
    assert monitor.events == [] and model.updates == [] and model.batches == []
    res.add_batch({"v": np.ones(1)})
    assert eng.step().step == 0


class OrderSpy(AdmitAll):
    def __init__(self, log):
        super().__init__()
        self.log = log

    def admit(self, event, position=None):
        self.log.append("admit")
        return super().admit(event)


def test_ledger_append_happens_before_any_noise(monkeypatch):
    log: list[str] = []
    real_gauss, real_sym = engine_mod.gaussian_noise, engine_mod.symmetric_noise
    monkeypatch.setattr(engine_mod, "gaussian_noise", lambda *a: (log.append("noise"), real_gauss(*a))[1])
    monkeypatch.setattr(engine_mod, "symmetric_noise", lambda *a: (log.append("noise"), real_sym(*a))[1])
    model = FakeModel(BLOCKS)
    orig_update = model.update
    model.update = lambda m, rho: (log.append("update"), orig_update(m, rho))[1]
    eng = make_engine(model, full_reservoir(20), FixedSizeSampler(5), OrderSpy(log))
    eng.step()
    assert log == ["admit", "noise", "noise", "noise", "update"]  # one draw per block, after admit


def test_refused_step_releases_nothing_and_halts():
    model = FakeModel(BLOCKS)
    ledger = MemoryLedger()
    # One fixed-size step at z=1, q=0.5 costs far more than epsilon 0.01.
    monitor = BudgetMonitor(0.01, 1e-5, RdpAccountant(), ledger)
    eng = make_engine(model, full_reservoir(20), FixedSizeSampler(10), monitor, accountant_name="autodp")
    assert eng.step() is None
    assert eng.halted and ledger.events() == [] and model.updates == []
    assert eng.step() is None  # halted for good
    assert model.updates == []


def test_step_index_event_rho_and_report_follow_the_ledger():
    model = FakeModel(BLOCKS, diameter=1.5)
    ledger = MemoryLedger()
    coarse = PldAccountant(value_discretization_interval=1e-3)
    monitor = BudgetMonitor(5.0, 1e-5, coarse, ledger)
    M, q, z = 40, 0.25, 2.0
    eng = make_engine(model, full_reservoir(M), PoissonSampler(q), monitor, z=z, tau0=10.0, kappa=0.7,
                      accountant_name="pld", seeded=True)
    results = [eng.step() for _ in range(3)]
    assert [r.step for r in results] == [0, 1, 2]
    assert [rho for _, rho in model.updates] == pytest.approx([(10.0 + t) ** -0.7 for t in range(3)])
    assert ledger.events() == [SubsampledGaussianEvent(z, q, "poisson", "replace_one", 1.5)] * 3
    rep = eng.privacy_report(steps=3, halted=False)
    fresh = PldAccountant(value_discretization_interval=1e-3)
    assert rep["epsilon_spent"] == pytest.approx(fresh.epsilon(ledger.events(), 1e-5), rel=1e-9)
    assert rep["epsilon_spent"] == eng.epsilon_spent()
    assert (rep["noise_multiplier"], rep["paper_sigma"], rep["q"], rep["sampling"]) == (z, z / 1.5, q, "poisson")
    assert (rep["steps"], rep["halted"], rep["seeded"], rep["accountant"]) == (3, False, True, "pld")
    assert (rep["delta"], rep["epsilon_budget"], rep["adjacency"]) == (1e-5, 5.0, "replace_one")


@pytest.mark.parametrize("sampler,normaliser", [(PoissonSampler(0.2), 0.2 * 50), (FixedSizeSampler(7), 7.0)])
def test_mean_uses_the_public_normaliser_not_the_batch_size(sampler, normaliser):
    model = FakeModel((Block("vec", (3,), 1.0),))
    eng = PrivateEngine(model, full_reservoir(50, value=0.5), sampler, None, 0.0, np.random.default_rng(3),
                        tau0=1.0, kappa=1.0, accountant_name="none", non_private=True)
    for _ in range(5):
        eng.step()
    for batch, (mean, _) in zip(model.batches, model.updates):
        exact = model.clipped_sum(batch)["vec"]
        np.testing.assert_allclose(mean["vec"], exact / normaliser, rtol=1e-12)
    sizes = [len(b["v"]) for b in model.batches]
    if isinstance(sampler, PoissonSampler):
        assert len(set(sizes)) > 1  # realised sizes vary; the normaliser does not


@pytest.mark.parametrize("sampler,normaliser", [(PoissonSampler(0.3), 0.3 * 60), (FixedSizeSampler(20), 20.0)])
def test_the_normaliser_stays_public_when_slots_hold_rejected_records(sampler, normaliser):
    """A rejected record that won a slot leaves it empty (privacy rule 4): the batch then holds
    fewer records than were sampled, and the sum is still divided by S or q*M, never by the
    number of valid slots (which depends on record values)."""
    M = 60
    res = Reservoir({"v": (np.float64, ())}, M, np.random.default_rng(4))
    accepted = np.arange(M) % 3 != 0  # every third arrival fails validation: its slot stays empty
    res.add_batch({"v": np.full(int(accepted.sum()), 0.5)}, accepted=accepted)
    assert res.full and not res.valid.all()
    model = FakeModel((Block("vec", (3,), 1.0),))
    eng = PrivateEngine(model, res, sampler, None, 0.0, np.random.default_rng(3), tau0=1.0, kappa=1.0,
                        accountant_name="none", non_private=True)
    for _ in range(5):
        eng.step()
    sizes = [len(b["v"]) for b in model.batches]
    assert max(sizes) < normaliser  # empty slots were drawn: batches are smaller than the normaliser
    for batch, (mean, _) in zip(model.batches, model.updates):
        np.testing.assert_allclose(mean["vec"], model.clipped_sum(batch)["vec"] / normaliser, rtol=1e-12)


class UncheckedSampler(FixedSizeSampler):
    """A sampler that draws from whatever the reservoir holds, without its own fullness check."""

    def sample(self, reservoir_size, rng, *, capacity):
        return np.sort(rng.choice(reservoir_size, size=min(self.batch_size, reservoir_size), replace=False))


def test_the_engine_refuses_a_reservoir_that_is_not_full_whatever_the_sampler():
    """Privacy rule 5 is the engine's own check: q = S / M assumes M records, so a sampler that does
    not check fullness must still never see a partial reservoir (nothing sampled, paid or released)."""
    model = FakeModel(BLOCKS)
    res = Reservoir({"v": (np.float64, ())}, 10, np.random.default_rng(0))
    res.add_batch({"v": np.ones(6)})
    monitor = AdmitAll()
    eng = make_engine(model, res, UncheckedSampler(3), monitor)
    with pytest.raises(ReservoirNotFull, match="6 of 10"):
        eng.step()
    assert monitor.events == [] and model.updates == [] and model.batches == []
    res.add_batch({"v": np.ones(4)})
    assert eng.step().step == 0 and len(model.batches[0]["v"]) == 3


def test_zero_noise_needs_explicit_non_private_mode_and_never_claims_privacy():
    model = FakeModel(BLOCKS)
    res = full_reservoir(10)
    with pytest.raises(ValueError, match="non_private"):
        make_engine(model, res, FixedSizeSampler(2), AdmitAll(), z=0.0)
    with pytest.raises(ValueError):
        PrivateEngine(model, res, FixedSizeSampler(2), AdmitAll(), 0.0, np.random.default_rng(0), 1.0, 1.0,
                      "none", non_private=True)
    with pytest.raises(ValueError, match="monitor"):
        make_engine(model, res, FixedSizeSampler(2), None, z=1.0)
    eng = PrivateEngine(model, res, FixedSizeSampler(2), None, 0.0, np.random.default_rng(0), 1.0, 1.0,
                        "none", non_private=True)
    eng.step()
    rep = eng.privacy_report(steps=1, halted=False)
    assert rep["epsilon_spent"] is None and rep["epsilon_budget"] is None and rep["private"] is False
    assert rep["noise_multiplier"] == 0.0 and rep["accountant"] == "none"
    assert eng.epsilon_spent() == math.inf  # no guarantee: never a finite number


def test_clipped_sum_must_return_the_declared_blocks():
    class Wrong(FakeModel):
        def clipped_sum(self, batch):
            return {"vec": np.zeros(3)}

    monitor = AdmitAll()
    eng = make_engine(Wrong(BLOCKS), full_reservoir(10), FixedSizeSampler(2), monitor)
    with pytest.raises(ValueError, match="declares"):
        eng.step()
    assert monitor.events == []  # a broken model never costs budget


@pytest.mark.parametrize("sampler", [FixedSizeSampler(10), PoissonSampler(0.25)])
def test_engine_tells_the_model_its_public_noise_scale(sampler):
    """The model learns std_k / normaliser per block once, from configuration only."""
    seen: list[dict[str, float]] = []

    class Listening(FakeModel):
        def set_noise_scale(self, mean_stds):
            seen.append(dict(mean_stds))

    M, z = 40, 2.5
    eng = make_engine(Listening(BLOCKS), full_reservoir(M), sampler, AdmitAll(), z=z)
    normaliser = sampler.normaliser(M)
    assert seen == [{name: pytest.approx(std / normaliser, rel=1e-12) for name, std in eng.block_stds.items()}]
    assert all(v > 0 for v in seen[0].values())


def test_private_engine_refuses_an_unbounded_block():
    model = FakeModel((Block("vec", (3,), math.inf),))
    with pytest.raises(ValueError, match="no finite per-record bound"):
        make_engine(model, full_reservoir(10), FixedSizeSampler(5), AdmitAll())


class Allocated(FakeModel):
    """A model whose diameter depends on the noise allocation, with an allocation rule of its own
    and a floor on z (as logistic regression and SEP have)."""

    supports_key_unit = True
    key_unit_note = ""

    def __init__(self, blocks, default_weights=None):
        super().__init__(blocks)
        self._default = default_weights

    def default_block_weights(self):
        return self._default

    def diameter(self, weights=None):
        return 1.0 + sum(0.3 / i * w for i, w in enumerate((weights or {}).values(), start=1))

    def group_diameter(self, weights=None):
        return 10.0 * self.diameter(weights)

    def check_noise_multiplier(self, z):
        if z < 0.5:
            raise ValueError(f"z must be >= 0.5 for this model, got {z}")


TWO = (Block("a", (3,), 1.0), Block("b", (2,), 2.0))


@pytest.mark.parametrize("given, default", [(None, None), ({"a": 3.0, "b": 1.0}, None), (None, {"a": 1.0, "b": 4.0}),
                                            ({"a": 3.0, "b": 1.0}, {"a": 1.0, "b": 4.0})])
def test_the_diameter_and_the_noise_follow_the_allocation_the_engine_uses(given, default):
    """Explicit block weights win over the model's own rule, which wins over a_k ~ C_k; the event's
    diameter is the model's for exactly those weights, and so are the noise stds (privacy rule 6)."""
    model = Allocated(TWO, default)
    chosen = given if given is not None else default
    weights = allocation_weights(TWO, chosen)
    assert allocation_diameter(model, given) == model.diameter(weights)
    assert allocation_diameter(model, given, unit="key") == model.group_diameter(weights)
    eng = make_engine(model, full_reservoir(10), FixedSizeSampler(5), AdmitAll(), z=2.0, block_weights=given)
    assert eng.diameter == eng.event().diameter == model.diameter(weights)
    a = np.array([weights["a"], weights["b"]])
    assert [eng.block_stds["a"], eng.block_stds["b"]] == pytest.approx(2.0 * np.array([1.0, 2.0]) / a, rel=1e-12)


def test_allocation_weights_fall_back_to_equal_weights_for_a_block_without_a_bound():
    blocks = (Block("a", (3,), 0.0), Block("b", (2,), 2.0))
    assert allocation_weights(blocks, None) == pytest.approx({"a": 2**-0.5, "b": 2**-0.5})


@pytest.mark.parametrize("bound", [math.inf, math.nan, 0.0])
def test_a_private_engine_refuses_a_block_without_a_finite_positive_bound(bound):
    model = FakeModel((Block("vec", (3,), bound), Block("ok", (2,), 1.0)))
    with pytest.raises(ValueError, match="no finite per-record bound"):
        make_engine(model, full_reservoir(10), FixedSizeSampler(5), AdmitAll())


def test_the_engine_asks_the_model_to_check_z_and_refuses_key_level_for_a_model_without_it():
    with pytest.raises(ValueError, match="z must be >= 0.5"):
        make_engine(Allocated(TWO), full_reservoir(10), FixedSizeSampler(5), AdmitAll(), z=0.4)
    engine = make_engine(Allocated(TWO), full_reservoir(10), FixedSizeSampler(5), AdmitAll(), z=0.5)
    assert engine.noise_multiplier == 0.5
    keys = KeyReservoir({"v": (np.float64, ())}, 10, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="not supported by the fake family"):
        make_engine(FakeModel(TWO), keys, FixedSizeSampler(5), AdmitAll(), unit="key")


def test_noise_is_added_to_every_block_however_small_its_std():
    """A block whose std is below 1 (small z * C / a) is noised like any other."""
    z, M, S = 0.5, 40, 8
    model = FakeModel((Block("small", (500,), 0.01),))
    eng = make_engine(model, full_reservoir(M, value=0.0), FixedSizeSampler(S), AdmitAll(), z=z)
    assert eng.block_stds["small"] == pytest.approx(z * 0.01)
    eng.step()
    noise = model.updates[0][0]["small"] * S  # the exact sum is 0: what was released is the noise
    assert noise.std() == pytest.approx(z * 0.01, rel=0.15)


def test_the_private_report_carries_the_monitor_s_delta_ledger_window_and_halt():
    model = FakeModel(BLOCKS)
    ledger = MemoryLedger()
    monitor = BudgetMonitor(50.0, 1e-6, RdpAccountant(), ledger, window=4)
    eng = make_engine(model, full_reservoir(20), FixedSizeSampler(5), monitor, z=3.0, accountant_name="rdp")
    assert eng.step().step == 0
    rep = eng.privacy_report(steps=1, halted=True)
    assert (rep["delta"], rep["ledger_id"], rep["window_steps"], rep["halted"]) == (1e-6, ledger.ledger_id, 4, True)
    assert rep["seeded"] is False  # the engine's default: only a fixed seed says otherwise (privacy rule 9)


def test_a_non_private_engine_counts_its_own_steps_and_draws_no_noise():
    """Without a ledger the engine numbers its steps 0, 1, 2, ...; the step size follows them, and
    the generator draws only batches (z = 0: no noise, not even zeros)."""
    values = np.arange(30.0)
    res = Reservoir({"v": (np.float64, ())}, 30, np.random.default_rng(0))
    res.add_batch({"v": values})
    model = FakeModel((Block("vec", (3,), 1.0),))
    eng = PrivateEngine(model, res, FixedSizeSampler(4), None, 0.0, np.random.default_rng(11), tau0=2.0, kappa=0.6,
                        accountant_name="rdp", non_private=True)
    assert eng.last_step is None
    results = [eng.step() for _ in range(3)]
    assert [r.step for r in results] == [0, 1, 2] and eng.last_step == 2
    assert [r.rho for r in results] == pytest.approx([(2.0 + t) ** -0.6 for t in range(3)])
    assert all(0.0 <= r.duration_s < 60.0 for r in results)
    rng = np.random.default_rng(11)
    expected = [res.take(FixedSizeSampler(4).sample(30, rng, capacity=30))["v"].tolist() for _ in range(3)]
    assert [b["v"].tolist() for b in model.batches] == expected
    rep = eng.privacy_report(steps=3, halted=False)
    assert rep["delta"] == 1e-5 and rep["accountant"] == "none"  # the default delta, echoed


@pytest.mark.parametrize("weights, why", [({"a": 1.0}, "mismatch"), ({"a": 1.0, "b": 1.0, "c": 1.0}, "mismatch"),
                                          ({"a": -1.0, "b": 1.0}, "> 0"), ({"a": 0.0, "b": 1.0}, "> 0"),
                                          ({"a": float("nan"), "b": 1.0}, "> 0")])
def test_allocation_weights_refuse_weights_that_name_other_blocks_or_are_not_positive(weights, why):
    """An allocation must name exactly the released blocks with weights > 0: a missing block would
    get no noise share, an extra name would be silently ignored, and a zero or negative weight
    would not give the block the noise the diameter assumes (privacy rule 6)."""
    with pytest.raises(ValueError, match=why):
        allocation_weights(TWO, weights)


def test_contributions_of_one_step_add_blockwise_and_others_are_refused():
    """Contribution.plus is the sum over disjoint parts of the reservoir (what a sharded driver
    adds up): blockwise sums at the same position; a contribution of another step or with other
    blocks is refused rather than added."""
    from stream_vips.core.engine import Contribution

    a = Contribution({"a": np.array([1.0, 2.0]), "b": np.array([[1.0]])}, position=7)
    b = Contribution({"a": np.array([0.5, -1.0]), "b": np.array([[3.0]])}, position=7)
    both = a.plus(b)
    assert both.position == 7 and set(both.sums) == {"a", "b"}
    np.testing.assert_array_equal(both.sums["a"], [1.5, 1.0])
    np.testing.assert_array_equal(both.sums["b"], [[4.0]])
    with pytest.raises(ValueError, match="different steps or blocks"):
        a.plus(Contribution(b.sums, position=8))
    with pytest.raises(ValueError, match="different steps or blocks"):
        a.plus(Contribution({"a": b.sums["a"]}, position=7))


def test_a_steps_duration_covers_its_contribution_and_its_release(monkeypatch):
    """StepResult.duration_s (the step latency operators see) runs from before the sampling to
    after the update, also when the contribution and the release are called separately."""
    clock = [100.0]
    monkeypatch.setattr(engine_mod.time, "perf_counter", lambda: clock[0])
    eng = make_engine(FakeModel(BLOCKS), full_reservoir(10), FixedSizeSampler(5), AdmitAll(), z=1.0)
    contribution = eng.contribution

    def slow_contribution():
        clock[0] += 5.0  # the E-step behind the wall takes 5 s
        return contribution()

    monkeypatch.setattr(eng, "contribution", slow_contribution)
    assert eng.step().duration_s == 5.0
    part = slow_contribution()
    clock[0] += 2.0
    assert eng.release(part).duration_s == 0.0  # timed from the call when no start is given
    assert eng.release(slow_contribution(), started=clock[0] - 5.0).duration_s == 5.0


def test_the_released_mean_is_the_sum_plus_the_noise_drawn_over_the_public_normaliser():
    """The noise the engine's generator draws is added to each block, in block order (a seeded
    run releases these exact values; subtracting the draw would release other ones)."""
    from stream_vips.privacy.mechanisms import gaussian_noise, symmetric_noise

    model = FakeModel(BLOCKS)
    eng = make_engine(model, full_reservoir(30), FixedSizeSampler(6), AdmitAll(), z=1.5)
    r = np.random.default_rng(7)
    sums = {b.name: r.normal(size=b.shape) for b in BLOCKS}
    twin = np.random.Generator(type(eng.rng.bit_generator)(0))
    twin.bit_generator.state = eng.rng.bit_generator.state
    released = eng._noisy_mean(sums)
    for b in BLOCKS:
        std = eng.block_stds[b.name]
        noise = symmetric_noise(twin, b.shape[0], std) if b.symmetric else gaussian_noise(twin, b.shape, std)
        assert np.abs(noise).max() > 0.1
        assert np.array_equal(released[b.name], (sums[b.name] + noise) / eng.normaliser), b.name
