"""Every registered family meets the contract of :class:`stream_vips.models.base.Model`, checked
the same way for each one (a new family is in every test here the moment it is registered):

* hostile records (wrong types, NaN and infinities, huge values, wrong shapes, missing and extra
  fields, values that are not objects) are rejected with a known reason or parsed, never raise,
  and every parsed record's clipped contribution is within each block's bound;
* two batches that differ in one record move the clipped sums by at most the engine's diameter
  (in units of the joint bound, under the family's noise allocation), over many random pairs;
* the clipped sums are summable: a batch's equals the sum over a partition of it (to float64
  rounding), an empty batch gives zeros and the update runs on noise alone;
* the state survives noisy updates, ``state()`` -> ``load_state`` and a model message;
* the audit pair exists and runs through the engine (or the family says why it has none);
* the fit rule reads public quantities only: equal settings for two data sets of equal N and d,
  and a seeded fit of a small synthetic set returns a model (ops: a refusal naming why);
* the family's synthetic data parse, and exactly its malformed lines are rejected.

Models are built from the family's own hooks: its fit rule's parameters at a small N, its
synthetic data's dimension. Families that release nothing through the engine (ops) skip the
checks of the released statistic, saying why.
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import warnings
from typing import Any

import numpy as np
import pytest

from stream_vips import messages
from stream_vips.client import posterior_from_message
from stream_vips.core.engine import allocation_diameter, allocation_weights
from stream_vips.models import MODEL_FAMILIES, model_class
from stream_vips.models.base import Model
from stream_vips.records import REASONS

FAMILIES = list(MODEL_FAMILIES)
#: Records per model (its dataset_size) and per fit.
CAPACITY = 64
#: Constructor parameters of the families without a fit rule (they have no other source of them).
REFUSED_PARAMS = {"ops": {"epsilon": 1.0, "mcmc_steps": 20}}
#: Relative slack on a bound: float64 rounding of norms computed on clipped values.
BOUND_RTOL = 1e-9


def dimension(cls: type[Model], data: Any) -> int:
    value = data.model_params[cls.dim_param]
    return cls.dimension_of(value) if cls.dimension_of is not None else int(value)


def build(family: str, seed: int = 0) -> tuple[Model, Any]:
    """A model of ``family`` with its fit rule's parameters at N = CAPACITY, and its synthetic data."""
    cls = model_class(family)
    data = cls.synthetic(np.random.default_rng(seed))
    if cls.engine_refusal is None:
        params = dict(cls.fit_rule(CAPACITY, dimension(cls, data), 1.0, 1e-5, False).model_params)
    else:
        params = dict(REFUSED_PARAMS[family])
    params.update(data.model_params, dataset_size=CAPACITY)
    if cls.seed_param is not None and cls.seed_param in inspect.signature(cls.__init__).parameters \
            and params.get(cls.seed_param) is None:
        params[cls.seed_param] = seed  # fixed public randomness, as a seeded run's derived seed: every call alike
    return cls(**params), data


def engine_only(family: str) -> None:
    reason = model_class(family).engine_refusal
    if reason is not None:
        pytest.skip(f"{family} releases nothing through the engine: {reason}")


def valid_records(data: Any, n: int) -> list[Any]:
    return [json.loads(line) for line in data.records(n)]


HOSTILE_VALUES = [math.nan, math.inf, -math.inf, 1e308, -1e308, 1e300, 5e-324, -0.0, 0, 1, -1, 2, 0.5, True, False,
                  None, "", "w0", "not a number", [], {}, [1, 2], [[1.0]], {"a": 1}, 10**30, -10**30, 2**63]


def hostile_records(valid: list[Any], rng: np.random.Generator, n: int) -> list[Any]:
    """``n`` mutations of valid records: a field replaced, a list entry replaced, a list scaled
    to huge values, shortened, lengthened or emptied, a field removed, an extra field added,
    or the record replaced by a value that is not an object."""
    def pick(values: list[Any]) -> Any:
        return copy.deepcopy(values[rng.integers(len(values))])

    out = []
    for _ in range(n):
        rec = copy.deepcopy(valid[rng.integers(len(valid))])
        field = pick(sorted(rec))
        op = rng.integers(9)
        value = rec[field]
        if op == 0:
            rec[field] = pick(HOSTILE_VALUES)
        elif op == 1 and isinstance(value, list) and value:
            value[rng.integers(len(value))] = pick(HOSTILE_VALUES)
        elif op == 2 and isinstance(value, list):
            rec[field] = [v * 1e300 if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
        elif op == 3 and isinstance(value, list):
            rec[field] = value[: rng.integers(len(value) + 1)]
        elif op == 4 and isinstance(value, list):
            rec[field] = value + [pick(value or HOSTILE_VALUES) for _ in range(rng.integers(1, 4))]
        elif op == 5 and isinstance(value, dict) and value:  # lda counts: a count replaced
            rec[field][pick(sorted(value))] = pick(HOSTILE_VALUES)
        elif op == 6:
            del rec[field]
        elif op == 7:
            rec[pick(["extra", "x", "y", "tokens", "counts", "z"])] = pick(HOSTILE_VALUES + valid[:1])
        else:
            rec = pick(HOSTILE_VALUES)
        out.append(rec)
    return out


def clipped_sum(family: str, rows: dict[str, np.ndarray], idx: Any) -> dict[str, np.ndarray]:
    """The clipped sums of ``rows[idx]`` by a fresh model (every call sees the same public state,
    its public draws included: dpvi's Monte Carlo draws come from the model's generator)."""
    return build(family)[0].clipped_sum({k: v[idx] for k, v in rows.items()})


def single_sums(family: str, rows: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Each row's clipped contribution alone (a one-record batch)."""
    return [clipped_sum(family, rows, slice(i, i + 1)) for i in range(len(next(iter(rows.values()))))]


def parsed_pool(model: Model, data: Any, seed: int) -> dict[str, np.ndarray]:
    """Rows of valid and hostile records the model accepted (its own parsing)."""
    rng = np.random.default_rng(seed)
    valid = valid_records(data, 40)
    parsed = model.parse_batch(valid + [r for r in hostile_records(valid, rng, 200) if r is not None])
    return parsed.rows


# ------------------------------------------------------------------------------------- records


@pytest.mark.parametrize("family", FAMILIES)
def test_hostile_records_are_rejected_or_clipped_within_their_bounds(family):
    model, data = build(family)
    rng = np.random.default_rng(1)
    valid = valid_records(data, 30)
    hostile = hostile_records(valid, rng, 300)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no overflow or invalid value on the way
        parsed = model.parse_batch(hostile)
    assert len(parsed.accepted) + len(parsed.rejected) == len(hostile)
    assert {reason for _, reason, _ in parsed.rejected} <= set(REASONS), family
    assert len(parsed.rejected) > 100, f"{family}: the mutations should mostly be invalid"
    if model_class(family).engine_refusal is not None:
        return  # no released statistic to bound (checked to skip below)
    bounds = {b.name: b.bound for b in model.blocks()}
    for sums in single_sums(family, parsed.rows):
        for name, bound in bounds.items():
            assert np.all(np.isfinite(sums[name])), (family, name)
            assert np.linalg.norm(sums[name]) <= bound * (1 + BOUND_RTOL), (family, name)


@pytest.mark.parametrize("family", FAMILIES)
def test_neighbouring_batches_differ_by_at_most_the_diameter(family):
    engine_only(family)
    model, data = build(family)
    pool = parsed_pool(model, data, seed=2)
    blocks = model.blocks()
    weights = allocation_weights(blocks, model.default_block_weights())
    scale = {b.name: weights[b.name] / b.bound for b in blocks}  # noise units: the joint bound is 1
    diameter = allocation_diameter(model)
    rng = np.random.default_rng(3)
    n = len(next(iter(pool.values())))
    worst = 0.0
    for _ in range(40):
        idx = rng.choice(n, size=7, replace=False)
        a, b = idx[:6], np.concatenate([idx[:5], idx[6:]])  # the same batch but its last record
        sa, sb = clipped_sum(family, pool, a), clipped_sum(family, pool, b)
        gap = math.sqrt(sum(scale[k] ** 2 * float(np.sum((sa[k] - sb[k]) ** 2)) for k in scale))
        worst = max(worst, gap)
    assert worst <= diameter * (1 + BOUND_RTOL), (family, worst, diameter)


@pytest.mark.parametrize("family", FAMILIES)
def test_clipped_sums_add_up_over_a_partition_and_an_empty_batch_adds_nothing(family):
    """The engine's contribution split (Contribution.plus) is exact: a batch's clipped sums equal
    the sum of its parts', to the rounding of adding n terms in another order (n eps times the
    sum of the terms' magnitudes)."""
    engine_only(family)
    model, data = build(family)
    pool = parsed_pool(model, data, seed=4)
    n = len(next(iter(pool.values())))
    order = np.random.default_rng(5).permutation(n)[:30]
    whole = clipped_sum(family, pool, order)
    parts = [clipped_sum(family, pool, p) for p in np.array_split(order, 3)]
    singles = single_sums(family, {k: v[order] for k, v in pool.items()})
    eps = np.finfo(np.float64).eps
    for b in model.blocks():
        magnitude = sum(np.abs(s[b.name]) for s in singles)
        tol = 16 * len(order) * eps * magnitude + 1e-300
        assert np.all(np.abs(whole[b.name] - sum(p[b.name] for p in parts)) <= tol), (family, b.name)
    empty = model.clipped_sum({k: v[:0] for k, v in pool.items()})
    for b in model.blocks():
        assert empty[b.name].shape == b.shape and not np.any(empty[b.name]), (family, b.name)
    rng = np.random.default_rng(0)
    model.update({b.name: 0.01 * b.bound * rng.standard_normal(b.shape) for b in model.blocks()}, 0.5)


# ------------------------------------------------------------------------------------- state


def noisy_updates(model: Model, data: Any) -> None:
    """Five updates at 20 block bounds of noise per entry: any public state a release can leave."""
    rows = model.parse_batch(valid_records(data, 8)).rows
    sums = model.clipped_sum(rows)
    stds = {b.name: 20.0 * b.bound / 8 for b in model.blocks()}
    model.set_noise_scale(stds)
    rng = np.random.default_rng(6)
    for t in range(5):
        model.update({b.name: sums[b.name] / 8 + stds[b.name] * rng.standard_normal(b.shape)
                      for b in model.blocks()}, 1.0 / (t + 1))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_state_round_trips_through_load_state_and_a_model_message(family):
    model, data = build(family)
    if model_class(family).engine_refusal is None:
        noisy_updates(model, data)
    state = model.state()
    restored, _ = build(family)
    restored.load_state(state)
    for name, value in restored.state().items():
        np.testing.assert_allclose(value, state[name], rtol=1e-12, atol=0, err_msg=f"{family}: {name}")
    report = messages.privacy_report(epsilon_spent=math.inf, delta=1e-5, epsilon_budget=math.inf, accountant="none",
                                     sampling="poisson", q=0.5, noise_multiplier=0.0, steps=5, halted=False,
                                     seeded=True, private=False)
    msg = messages.loads(messages.dumps(messages.build_message("conformance", family, model.hyperparameters(), 4,
                                                               state, report)))
    rebuilt = posterior_from_message(msg).model
    assert type(rebuilt) is type(model)
    for name, value in rebuilt.state().items():
        np.testing.assert_allclose(value, state[name], rtol=1e-12, atol=0, err_msg=f"{family}: {name}")


# ------------------------------------------------------------------------------------- audit


@pytest.mark.parametrize("family", FAMILIES)
def test_the_audit_pair_exists_and_runs_through_the_engine(family):
    from stream_vips.audit.spec import trials
    from stream_vips.models.auditing import FamilyAudit

    audit = model_class(family).audit()
    if isinstance(audit, str):
        assert audit.strip()
        pytest.skip(f"{family} is not audited: {audit}")
    assert isinstance(audit, FamilyAudit) and audit.family == family
    probe = audit.make_model(audit.capacity)
    assert type(probe) is model_class(family)
    assert len(probe.parse_batch(list(audit.candidates)).accepted) == len(audit.candidates)
    releases = trials(audit, audit.candidates[0], seed=0)(2)
    assert len(releases) == 2 and np.all(np.isfinite(releases))


# ------------------------------------------------------------------------------------- fit


@pytest.mark.parametrize("family", FAMILIES)
def test_the_fit_rule_reads_public_quantities_only_and_fits_a_small_synthetic_set(family):
    from stream_vips.errors import FitError
    from stream_vips.fitting import fit
    from stream_vips.fitting.api import prepare
    from stream_vips.fitting.rules import PYTHON_NAMES

    cls = model_class(family)
    assert list(inspect.signature(cls.fit_rule).parameters) == ["n", "d", "epsilon", "delta", "non_private"]
    data_a, data_b = (cls.synthetic(np.random.default_rng(seed)) for seed in (7, 8))
    records_a, records_b = data_a.records(CAPACITY), data_b.records(CAPACITY)
    assert records_a != records_b
    if cls.engine_refusal is not None:
        with pytest.raises(FitError, match=f"fit refuses the {family} family: "):
            fit(records_a, family, seed=0, **data_a.model_params)
        return
    plans = [prepare(records, family, 1.0, 1e-5, dim=None, non_private=False, seed=0, steps=None, x_columns=None,
                     y_column=None, ledger_path=None, settings=None, model_id="fit",
                     model_params=dict(data.model_params), names=PYTHON_NAMES)
             for records, data in ((records_a, data_a), (records_b, data_b))]
    assert plans[0].settings == plans[1].settings
    result = fit(records_a, family, 1.0, 1e-5, seed=0, steps=min(plans[0].settings.steps, 3), **data_a.model_params)
    assert result.report["accepted"] == CAPACITY and result.report["steps_taken"] >= 1
    assert isinstance(result.posterior.model, cls) and result.message["family"] == family


# ------------------------------------------------------------------------------------- synthetic data


@pytest.mark.parametrize("family", FAMILIES)
def test_the_synthetic_data_parse_and_exactly_their_malformed_lines_are_rejected(family):
    from connectors.synthetic import SyntheticSource
    from stream_vips.records import decode_json

    model, data = build(family)
    source = SyntheticSource(family, count=300, seed=9, malformed_fraction=0.2)
    lines = [r.value for r in source.poll(300, 0.0)]
    decoded = decode_json(lines)
    parsed = model.parse_batch(decoded.values)
    rejected = {i for i, _, _ in decoded.rejected} | {decoded.index[i] for i, _, _ in parsed.rejected}
    bad = {i for i, line in enumerate(lines) if line in set(source.data.malformed)}
    assert 0 < len(bad) < len(lines)
    assert rejected == bad, family
