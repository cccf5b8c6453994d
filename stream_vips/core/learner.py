"""PrivateLearner: the I/O-free core of stream_vips (model, reservoir, trigger, engine, messages).

A learner takes records, keeps them in its bounded reservoir, takes private steps when its
trigger fires, and builds model messages; it never polls, commits, publishes, serves metrics or
handles signals (the runtime, :class:`stream_vips.service.app.Application`, does). Everything that a
checkpoint must persist is :meth:`PrivateLearner.state`, including the binding to the ledger
that paid for it (privacy rule 11 in docs/privacy.md).

Length: over 600 lines, one module: it is the one class :class:`PrivateLearner`, whose
methods all act on the same reservoir, trigger, engine and ledger binding (what is fed decides
when a step is paid, and the state saved is what the ledger paid for), and a runnable example in
this docstring; its wiring from a configuration is already :mod:`stream_vips.core.build`. Moving
some of its methods elsewhere would split one object's invariants across files.

Notebook use needs one import: the defaults keep the ledger in memory (``ledger_path=`` makes it
durable), serve no metrics and stop when the budget is spent or the data ends. No step is taken
before the reservoir (``reservoir=``, 10000 by default) is full, so data smaller than it give no
model: ``learn_many`` then warns why, and :func:`stream_vips.fit` fits a finite data set whole.

>>> import numpy as np
>>> from stream_vips import PrivateLearner
>>> rng = np.random.default_rng(0)
>>> X = rng.uniform(-0.5, 0.5, size=(3000, 2))
>>> y = X @ np.array([0.8, -0.4]) + 0.05 * rng.standard_normal(3000)
>>> learner = PrivateLearner("linreg", dim=2, epsilon=2.0, reservoir=1000, batch_size=500,
...                          every_records=250, planned_steps=9, seed=1)
>>> learner = learner.learn_many((X, y))
>>> learner.steps_taken, learner.epsilon_spent <= 2.0
(9, True)
>>> learner.privacy_report()["ledger_id"] == learner.ledger.ledger_id
True
>>> mean, variance = learner.posterior.model.predictive(np.array([[0.5, 0.5]]))
>>> bool(abs(mean[0] - 0.2) < 0.1)
True

With ``ledger_path=`` the spending is durable and the file stays locked while the learner is
open; a ``with`` block closes it, so running the cell again reopens the same budget:

>>> import pathlib, tempfile
>>> tmp = tempfile.TemporaryDirectory()
>>> options = dict(dim=2, epsilon=2.0, reservoir=1000, batch_size=500, every_records=250,
...                planned_steps=9, seed=1, ledger_path=pathlib.Path(tmp.name) / "ledger.jsonl")
>>> with PrivateLearner("linreg", **options) as durable:
...     spent = durable.learn_many((X[:1500], y[:1500])).epsilon_spent
>>> with PrivateLearner("linreg", **options) as again:
...     again.epsilon_spent == spent
True
>>> tmp.cleanup()
"""

from __future__ import annotations

import collections
import logging
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from stream_vips import records
from stream_vips.config import Config
from stream_vips.core import build
from stream_vips.core.data.decoding import DecodedBatch, decode_batch
from stream_vips.core.data.protocols import AnyReservoir, KeySlotReservoir, RecordReservoir
from stream_vips.core.engine import StepResult
from stream_vips.core.keys import ArrivalKeys, Keys, RawKeys, arrival_keys, field_keys, with_keys
from stream_vips.core.publishing import Publishing
from stream_vips.errors import StepRefused, StreamVipsError
from stream_vips.models.base import Model
from stream_vips.privacy.budget import BudgetMonitor
from stream_vips.privacy.ledger import Ledger, LedgerMismatch, check_binding
from stream_vips.records import DataSet, RawRecord, tabular, top_reasons

if TYPE_CHECKING:
    from stream_vips.models.posterior import PublishedModel

log = logging.getLogger("stream_vips.core.learner")


class StateMismatch(StreamVipsError, ValueError):
    """A saved state that does not fit this learner (another family, layout or capacity)."""


class PrivateLearner(Publishing):
    """One model family learning privately from records (see the module docstring).

    Build it from keyword arguments (notebook defaults; anything a configuration file can say,
    flattened: ``epsilon``, ``delta``, ``reservoir``, ``batch_size``, ``sampling``,
    ``every_records``, ``every_seconds``, ``planned_steps``, ``noise_multiplier``, ``seed``,
    ``ledger_path``, ``model_id`` and the family's own parameters), or from a validated
    configuration with :meth:`from_config`. ``non_private=True`` runs with z = 0 and no guarantee
    (the spelling :func:`stream_vips.fit` and the estimators use; a configuration file says
    ``privacy.mode: non_private``, and ``mode=`` here is deprecated).
    """

    def __init__(self, family: str | None = None, *, config: Config | None = None, ledger: Ledger | None = None,
                 **options: object) -> None:
        from stream_vips.config import ConfigError, config_from_dict
        from stream_vips.models import model_class

        #: family parameters the user did not give, so their defaults apply (``dim`` of linreg)
        self.defaulted_params: dict[str, Any] = {}
        if config is None:
            if family is None:
                raise ConfigError("model.family: required")
            options = _privacy_mode(options)
            _check_options(family, options)
            config = config_from_dict(_notebook_config(family, options), env={})
            defaults = model_class(family).default_params
            self.defaulted_params = {k: v for k, v in defaults.items() if k not in options}
        elif family is not None or options:
            raise TypeError("pass either a configuration or a family with keyword options, not both")
        self.config = config
        cfg = config
        built = build.parts(cfg, ledger)
        self.model: Model = built.model
        self.model_id = cfg.model.id
        self.unit = cfg.privacy.unit
        self.reservoir: AnyReservoir = built.reservoir
        self.window_steps = built.window_steps
        self.trigger = built.trigger
        self.ledger: Ledger | None = built.ledger
        self._owns_ledger = built.owns_ledger
        self.engine = built.engine
        #: the engine's budget monitor, as what it is (``None``: a non-private learner)
        self.monitor: BudgetMonitor | None = built.monitor
        monitor, window = built.monitor, built.window_steps
        self.steps_taken = 0
        self.skipped_steps = 0
        self.rejected: collections.Counter = collections.Counter()  # reasons of rejected arrivals (public)
        self._fed = self._offered = 0  # arrivals given to this learner, and those that reached its reservoir
        self.max_rejected_fraction = cfg.sampling.max_rejected_fraction
        self._refused: str | None = None
        self._replay_until: int | None = None
        # window accounting bounds a record's steps by its stream position; an earlier life's steps
        # leave this learner's positions unknown until a checkpoint is restored (load_state)
        self._unplaced = bool(window) and monitor is not None and monitor.steps > 0
        # ... and bounds a record's steps by L = ceil(M / k) only while steps are k arrivals apart
        self._window_every = cfg.schedule.every_records if window else None
        self._last_step_position = self.ledger.last_position if window and self.ledger is not None else None
        self.validation = cfg.sampling.validation
        #: log a refused step (False when the caller reports the reason itself: ``fit`` raises it)
        self.log_refusals = True

    @classmethod
    def from_config(cls, config: Config, ledger: Ledger | None = None) -> PrivateLearner:
        """A learner from a validated :class:`~stream_vips.config.Config` (``ledger`` replaces the
        configured one; the caller then owns it)."""
        return cls(config=config, ledger=ledger)

    # -- state --------------------------------------------------------------------------------

    @property
    def halted(self) -> bool:
        """True once a step was refused (the budget is spent, or the reservoir holds mostly
        rejected arrivals): no more releases, ever."""
        return self.engine.halted or self._refused is not None

    @property
    def halt_reason(self) -> str | None:
        """Why updates halted (``None`` while they go on)."""
        if self._refused is not None:
            return self._refused
        return self._budget().halt_reason if self.engine.halted else None

    @property
    def halt_cause(self) -> str | None:
        """``"budget"`` (the planned end: no further step fits the privacy budget),
        ``"rejected_data"`` (the reservoir holds mostly rejected arrivals: the input is wrong)
        or ``None`` while updates go on."""
        if self._refused is not None:
            return "rejected_data"
        return "budget" if self.engine.halted else None

    @property
    def epsilon_spent(self) -> float:
        """epsilon of everything in the ledger (infinite for a non-private learner)."""
        return self.engine.epsilon_spent()

    @property
    def posterior(self) -> PublishedModel:
        """The current model as a posterior with predictive methods (built from its message, so
        exactly what a reader of the model topic would get)."""
        from stream_vips.models.posterior import posterior_from_message

        message = self.message()
        if message is None:
            raise StreamVipsError("no private step has been taken yet, so there is no released model: "
                                  + self.why_no_model())
        return posterior_from_message(message)

    def why_no_model(self) -> str:
        """Why there is no released model yet (:meth:`message` is ``None``) and what to do, in one
        line: records fed and rejected (top reasons), whether updates halted and why, the
        reservoir's fill and the trigger. Only public quantities (privacy rule 1): counts,
        reasons, configuration."""
        res, trigger = self.reservoir, self.trigger
        top = self._top_rejections()
        fed = f"{self._fed} records fed"
        if self._offered < self._fed:
            fed += f" ({self._offered} reached the reservoir before updates halted)"
        parts = [f"{fed}, {sum(self.rejected.values())} rejected" + (f" ({top})" if top else "")]
        if self.halted:
            parts.append(f"updates halted: {self.halt_reason}")
        else:
            parts.append("updates have not halted")
            if not res.full:
                slots = "key slots" if self.unit == "key" else "records"
                parts.append(f"the reservoir is not yet full: it holds {res.size} of {res.capacity} {slots}, and no "
                             "step is taken before it is full (privacy rule 5); feed at least "
                             f"{res.capacity - res.size} more records, pass a smaller reservoir= (and batch_size=), "
                             "or fit a finite data set with stream_vips.fit (the whole data set is its reservoir)")
            elif self._replay_until is not None:
                parts.append(f"the ledger already paid for a step at stream position {self._replay_until}: no step "
                             f"before the stream passes it (now at {res.seen})")
            elif trigger.every_records is not None:
                parts.append(f"the reservoir is full and the next step is due after "
                             f"{max(1, trigger.every_records - trigger.pending)} more arrivals (every_records="
                             f"{trigger.every_records}): feed more records"
                             + ("" if self._window_every else ", or call step() to take one now")
                             + "; a finite table is fitted whole, with every planned step, by stream_vips.fit")
            else:
                parts.append(f"the reservoir is full and the next step is due every_seconds={trigger.every_seconds}: "
                             "feed more records or call step(); a finite table is fitted whole, with every "
                             "planned step, by stream_vips.fit")
        if "dim" in self.defaulted_params and self.rejected.get("wrong_shape"):
            parts.append(f"no dim= was given, so the {self.model.family} default dim={self.defaulted_params['dim']} "
                         "applies: pass dim= (the length of your records' x)")
        return "; ".join(parts)

    def _top_rejections(self) -> str:
        """The three most common rejection reasons with their counts (public, privacy rule 1)."""
        return top_reasons(self.rejected)

    def state(self) -> dict[str, Any]:
        """What a checkpoint persists: reservoir (rows, positions, RNG), model, trigger, and the
        ledger id and step count that paid for them."""
        private = not self.engine.non_private
        return {
            "model_family": self.model.family,
            "reservoir": self.reservoir.get_state(),
            "model": self.model.state(),
            "trigger_pending": self.trigger.pending,
            "ledger_id": self._paying_ledger().ledger_id if private else None,
            "ledger_steps": self._budget().steps if private else None,
        }

    def load_state(self, state: Mapping[str, Any], what: str = "saved state") -> None:
        """Restore :meth:`state` (a checkpoint). Refuses state of another family or layout
        (:class:`StateMismatch`) and state this ledger did not pay for (``LedgerMismatch``). No
        step is then taken at a stream position where an earlier life took one: the ledger paid
        for it (a crash loop must not pay again)."""
        if state["model_family"] != self.model.family:
            raise StateMismatch(f"{what} is for family {state['model_family']!r}, not {self.model.family!r}")
        if not self.engine.non_private:
            check_binding(self._paying_ledger(), what, state.get("ledger_id"), state.get("ledger_steps"))
        try:
            self.reservoir.set_state(state["reservoir"])
            self.model.load_state(state["model"])
        except ValueError as exc:
            raise StateMismatch(f"{what} does not fit this learner: {exc}") from exc
        self.trigger.pending = int(state["trigger_pending"])
        self._unplaced = False
        last = None if self.engine.non_private else self._paying_ledger().last_position
        if last is not None and last > self.reservoir.seen:
            self._replay_until = last
            log.warning("restored at stream position %d; the ledger holds steps up to position %d: "
                        "no step until the stream passes it", self.reservoir.seen, last)

    # -- learning -----------------------------------------------------------------------------

    def feed(self, values: Sequence[RawRecord] | Sequence[Mapping[str, Any]],
             keys: RawKeys | None = None) -> DecodedBatch:
        """Decode (bytes) or validate (dicts) one batch of records and offer it; returns the
        decoded batch, whose ``rejected`` lists ``(arrival, reason, detail)``. With
        ``privacy.unit: key``, ``keys`` are the arrivals' keys (e.g. Kafka message keys); with
        ``privacy.key_field`` set they are read from that field instead (privacy rule 12). With
        ``sampling.validation: admitted`` only the arrivals the reservoir admits are decoded
        (:meth:`offer_raw`)."""
        if self.validation == "admitted":
            return self.offer_raw(values, keys=self.keys_of(values, keys))
        if records.undecoded(values):
            batch = decode_batch(self.model, values)
        else:
            batch = _parse(self.model, values)
        return self.offer(batch, keys=self.keys_of(values, keys))

    def keys_of(self, values: Sequence[object], keys: RawKeys | None = None) -> RawKeys | None:
        """The privacy units of ``values``: the configured ``privacy.key_field`` when set (it wins
        over any other key), else ``keys`` (e.g. Kafka message keys); ``None`` for ``unit: record``."""
        if self.unit != "key":
            return None
        if self.config.privacy.key_field is not None:
            return field_keys(values, self.config.privacy.key_field)
        return keys

    def learn_many(self, data: DataSet, chunk: int = 5000) -> PrivateLearner:
        """Feed a whole data set: a list or iterable of record dicts, ``(X, y)`` arrays, ``X``
        alone (families without labels), or a pandas DataFrame (``x_columns``: all but ``y``).
        A ``str`` or ``bytes`` is refused (:class:`~stream_vips.errors.DataError`, nothing fed).
        Array and DataFrame columns are public schema: with no ``dim`` given, a column count other
        than the default is refused before anything is fed (``ConfigError``). The length of one
        record dict is not checked so: under replace-one adjacency it is that record's private
        content.

        A feed that ends with no released model warns why (:meth:`why_no_model`): no step is
        taken before the reservoir is full, so data smaller than it give no model (use
        :func:`stream_vips.fit` for a finite data set). Returns the learner (river style)."""
        from stream_vips.models import dimension

        arrays = tabular(data)
        if arrays is not None:
            self._check_columns(arrays[0].shape[1])
        for part in _chunks(_as_records(data, arrays, dimension(self.model.family)[0]), chunk):
            if self.halted:
                break
            self.feed(part)
        if self.last_step is None:
            warnings.warn(f"learn_many ended without a released model: {self.why_no_model()}", stacklevel=2)
        return self

    def _check_columns(self, columns: int) -> None:
        """Refuse array data whose column count (public schema) differs from a default ``dim``
        the user never gave, before anything is fed."""
        from stream_vips.config import ConfigError

        default = self.defaulted_params.get("dim")
        if default is not None and columns != default:
            raise ConfigError(f"model.params.dim: not given, so the {self.model.family} default dim={default} "
                              f"applies, but the data has {columns} columns: pass dim={columns} (nothing was fed)")

    def arrival_keys(self, values: Sequence[object], keys: RawKeys | None = None) -> ArrivalKeys | None:
        """The key ids of a batch's arrivals (:meth:`keys_of`, canonicalised once), for
        :meth:`offer` / :meth:`offer_raw` and for rejecting keyless arrivals before any step;
        ``None`` for ``unit: record``."""
        if self.unit != "key":
            return None
        return ArrivalKeys(*arrival_keys(self.keys_of(values, keys), len(values)))

    def offer(self, batch: DecodedBatch, stop: Callable[[], bool] = lambda: False,
              on_step: Callable[[StepResult], None] | None = None,
              keys: Keys | None = None) -> DecodedBatch:
        """Offer every arrival of ``batch`` to the reservoir, stepping when the trigger fires.

        Every arrival, valid or not, takes a reservoir position and counts towards
        ``every_records``: validity depends on the record's value, so membership and update
        times must not (privacy rule 1). A rejected arrival only leaves an empty slot. After
        ``stop()`` the rest of the batch still enters the reservoir, but no new step starts.

        With ``privacy.unit: key`` every arrival needs its key in ``keys`` (privacy rule 12); an
        arrival without one is rejected as ``missing_key`` and keeps its position. Returns the
        batch as offered (with those rejections).
        """
        ids = has = None
        if self.unit == "key":
            batch, ids, has = with_keys(batch, keys)
        ok = batch.ok
        self._fed += len(ok)
        self.rejected.update(reason for _, reason, _ in batch.rejected)
        row_end = np.cumsum(ok)

        def add(start: int, end: int) -> None:
            lo, hi = (int(row_end[start - 1]) if start else 0), int(row_end[end - 1])
            rows = {k: v[lo:hi] for k, v in batch.rows.items()}
            if ids is not None and has is not None:
                self._key_slots().add_batch(rows, ids[start:end], accepted=ok[start:end], has_key=has[start:end])
            else:
                self._records().add_batch(rows, accepted=ok[start:end])

        self._offer_chunks(len(ok), add, stop, on_step)
        return batch

    def offer_raw(self, values: Sequence[RawRecord] | Sequence[Mapping[str, Any]],
                  stop: Callable[[], bool] = lambda: False, on_step: Callable[[StepResult], None] | None = None,
                  keys: Keys | None = None,
                  on_rejected: Callable[[list[tuple[int, str, str]]], None] | None = None) -> DecodedBatch:
        """Admission before decoding (``sampling.validation: admitted``): offer every arrival of
        ``values`` (bytes or dicts), decoding and validating only those the reservoir admits.

        Each chunk between possible steps is admitted first (:meth:`Reservoir.admit`: positions
        and the reservoir's RNG only, the same draws :meth:`offer` makes), and only admitted
        arrivals are placed; a rejected admitted arrival empties its slot as in :meth:`offer`.
        What is decoded: the reservoir's :meth:`~Reservoir.candidates` for the whole batch (every
        arrival whose draw hits a slot, from a copy of its generator, decoded in one pass: a
        superset of every chunk's admissions), or, for a key reservoir, each chunk's admitted
        arrivals. So the reservoir (contents, validity, ``seen``, RNG state), the steps and the
        releases are exactly those of :meth:`offer` on the same stream; arrivals that hold no
        slot after their chunk could not reach a release, and most of them are never read. With
        ``privacy.unit: key``, ``keys`` are the arrivals' message keys (admission needs them
        before decoding); a keyless arrival takes no slot and is rejected as ``missing_key``
        without being decoded. Returns the batch with ``ok`` and ``rejected`` over the decoded
        (and keyless) arrivals only, ``rows`` empty and ``skipped`` the arrivals never decoded.
        ``on_rejected`` receives each decoding pass's rejects (position, reason, detail) as soon as
        they are known, before any step that follows it, so a caller can dead-letter them before
        budget is paid (an exception from it stops the offer there).
        """
        n = len(values)
        self._fed += n
        bytes_in = records.undecoded(values)
        ok = np.zeros(n, dtype=bool)
        rejected: list[tuple[int, str, str]] = []
        decoded = 0

        def decode(idx: np.ndarray) -> DecodedBatch:
            """Decode arrivals ``idx``; their rejections are recorded at their positions."""
            nonlocal decoded
            part_values: list[object] = list(map(values.__getitem__, idx.tolist()))
            part = (decode_batch(self.model, cast("list[RawRecord]", part_values)) if bytes_in  # a batch is one kind
                    else _parse(self.model, part_values))
            ok[idx[part.ok]] = True
            found = [(int(idx[i]), reason, detail) for i, reason, detail in part.rejected]
            rejected.extend(found)
            self.rejected.update(reason for _, reason, _ in found)
            decoded += idx.size
            if found and on_rejected is not None:
                on_rejected(found)
            return part

        ids = has = None
        if self.unit == "key":  # keyless arrivals take no slot: rejected as missing_key without decoding
            ids, has = arrival_keys(keys, n)
            rejected = ArrivalKeys(ids, has).missing()
            self.rejected.update(reason for _, reason, _ in rejected)
        candidates = self.reservoir.candidates(n)
        if candidates is not None:  # one decoding pass over a superset of every chunk's admissions
            pre = decode(candidates)
            row_of = np.cumsum(pre.ok) - 1

        def add(start: int, end: int) -> None:
            if ids is not None and has is not None:
                slots = self._key_slots()
                admission = slots.admit(ids[start:end], has[start:end])
                part = decode(admission.arrivals + start)
                slots.place(admission, part.rows, part.ok)
                return
            if candidates is None:
                raise RuntimeError("a reservoir of records named no candidates to decode")
            admission = self._records().admit(end - start)
            j = np.minimum(np.searchsorted(candidates, admission.arrivals + start), candidates.size - 1)
            if not np.array_equal(candidates[j], admission.arrivals + start):  # candidates() broke its promise
                raise RuntimeError("an admitted arrival was not among the reservoir's decoded candidates")
            good = pre.ok[j]
            self._records().place(admission, {k: v[row_of[j[good]]] for k, v in pre.rows.items()}, good)

        self._offer_chunks(n, add, stop, on_step)
        return DecodedBatch(ok, {}, sorted(rejected), skipped=n - decoded)

    def _offer_chunks(self, n: int, add: Callable[[int, int], None], stop: Callable[[], bool],
                      on_step: Callable[[StepResult], None] | None) -> None:
        """Add arrivals ``[start, end)`` chunk by chunk, cut where a step may be due, and step
        when the trigger fires (no new step after ``stop()``; nothing more once halted)."""
        start = 0
        while start < n and not self.halted:
            end = start + self._chunk(n - start)
            add(start, end)
            self._offered += end - start
            self.trigger.observe(end - start)
            start = end
            if self.reservoir.full and self.trigger.due() and not stop():
                result = self._step(by_trigger=True)
                if result is not None and on_step is not None:
                    on_step(result)

    def time_due(self) -> bool:
        """A time-based step is due (``every_seconds``) and the reservoir is full."""
        return self.trigger.every_seconds is not None and self.reservoir.full and self.trigger.due()

    def check_window_position(self) -> None:
        """Under window accounting, a ledger that already holds steps needs this learner's stream
        position restored first (:meth:`load_state`, a checkpoint): records read again at new
        positions would be in more than L steps, which the window cannot see. Raises
        ``LedgerMismatch`` otherwise."""
        if self._unplaced:
            raise LedgerMismatch(
                f"window accounting: ledger {self._paying_ledger().ledger_id} already holds {self._budget().steps} "
                "steps, "
                "but no checkpoint restored this learner's stream position: records read again would be in more "
                f"than {self.window_steps} steps; restore the checkpoint (runtime.checkpoint_path, load_state), "
                "or run `stream-vips reset` to start a new budget deliberately")

    def step(self) -> StepResult | None:
        """One private step now; ``None`` when the budget refused it (then :attr:`halted`) or when
        an earlier life already paid at this stream position (counted in :attr:`skipped_steps`).
        Raises ``LedgerMismatch`` when :meth:`check_window_position` does, and
        :class:`~stream_vips.errors.StepRefused` under window accounting when fewer than
        ``every_records`` arrivals came since the last step (nothing spent either way): the
        window's bound of L steps per record holds only for steps that far apart."""
        return self._step(by_trigger=False)

    def _step(self, by_trigger: bool) -> StepResult | None:
        """:meth:`step`; a step the trigger fires too soon under window accounting (its grid
        shifted against the ledger's positions by a held step or by positions paid ahead) is
        skipped like a replayed one instead of refused, so a restart never stops on it."""
        self.check_window_position()
        if self._replay_until is not None:
            if self.reservoir.seen <= self._replay_until:
                self.trigger.reset()
                self.skipped_steps += 1
                return None
            self._replay_until = None
        last, every = self._last_step_position, self._window_every  # both set under window accounting only
        if last is not None and every is not None and self.reservoir.seen - last < every:
            if by_trigger:
                self.trigger.reset()
                self.skipped_steps += 1
                return None
            raise StepRefused(
                f"window accounting: a step needs schedule.every_records = {self._window_every} arrivals after the "
                f"last one (at stream position {last}; now {self.reservoir.seen}), or a record would be in more "
                f"than {self.window_steps} steps; feed more records (steps follow by themselves)")
        if not self.engine.non_private and not self.engine.halted:
            empty = 1.0 - float(np.mean(self.reservoir.valid)) if self.reservoir.size else 0.0
            if empty > self.max_rejected_fraction:
                top = self._top_rejections()
                self._refused = (f"{empty:.0%} of the reservoir's slots hold rejected arrivals (more than "
                                 f"sampling.max_rejected_fraction = {self.max_rejected_fraction:g}); a step would "
                                 f"spend budget on almost nothing; top rejection reasons: {top or 'none recorded'}")
                if self.log_refusals:
                    log.error("updates halted before spending: %s", self._refused)
                return None
        result = self.engine.step()
        self.trigger.reset()
        if result is not None:
            self.steps_taken += 1
            if self._window_every is not None:
                self._last_step_position = self.reservoir.seen
        return result

    def _chunk(self, remaining: int) -> int:
        """Arrivals to add before the next possible update, so updates happen at exact positions."""
        res, every = self.reservoir, self.trigger.every_records
        if not res.full and self.unit == "record" and res.seen < res.capacity:
            return min(remaining, res.capacity - res.seen)
        if not res.full and every is not None:
            # a key reservoir fills when K distinct keys have arrived, a sampled window when M
            # arrivals were admitted: check at every multiple of every_records
            return min(remaining, every - self.trigger.pending % every)
        if every is not None:
            return min(remaining, max(1, every - self.trigger.pending))
        return remaining

    def pay_ahead(self, source_records: int | None) -> None:
        """Write the ledger's next steps in the background from now on (a service: see
        ``privacy.ledger.pay_ahead``), but none past the end of a source that delivers
        ``source_records`` more arrivals (``None``: no known end), which would leave it unused."""
        if self.engine.non_private or not self._budget().start_paying_ahead():
            return
        if source_records is not None:
            self._budget().last_position = self.reservoir.seen + source_records

    def settle(self) -> None:
        """Wait for a ledger write paid ahead to finish (before the ledger is closed)."""
        monitor = getattr(getattr(self, "engine", None), "monitor", None)
        if monitor is not None:
            monitor.settle()

    def close(self) -> None:
        """Release the ledger this learner opened (its file lock or its producer)."""
        self.settle()
        if self._owns_ledger and self.ledger is not None:
            self.ledger.close()
            self._owns_ledger = False

    # -- the two modes and the two kinds of reservoir, narrowed ----------------------------------

    def _budget(self) -> BudgetMonitor:
        """The budget monitor of a private learner (a non-private one has none)."""
        if self.monitor is None:
            raise StreamVipsError("a non-private learner (non_private=True; a file's privacy.mode: non_private) has "
                                  "no privacy budget")
        return self.monitor

    def _paying_ledger(self) -> Ledger:
        """The ledger that pays for a private learner's steps (a non-private one has none)."""
        if self.ledger is None:
            raise StreamVipsError("a non-private learner (non_private=True; a file's privacy.mode: non_private) has "
                                  "no ledger")
        return self.ledger

    def _records(self) -> RecordReservoir:
        """The reservoir of records (``privacy.unit: record``; build.reservoir made it so)."""
        if self.unit == "key":
            raise StreamVipsError("privacy.unit: key keeps key slots, not a reservoir of records")
        return cast(RecordReservoir, self.reservoir)

    def _key_slots(self) -> KeySlotReservoir:
        """The reservoir of key slots (``privacy.unit: key``; build.reservoir made it so)."""
        if self.unit != "key":
            raise StreamVipsError("privacy.unit: record keeps a reservoir of records, not key slots")
        return cast(KeySlotReservoir, self.reservoir)

    def __enter__(self) -> PrivateLearner:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close on leaving the block, also on an error (the ledger is durable up to it)."""
        self.close()


#: The keyword options of a notebook learner that are not model parameters, by section.
LEARNER_OPTIONS: dict[str, tuple[str, ...]] = {
    "privacy": ("epsilon", "delta", "planned_steps", "noise_multiplier", "seed", "accountant", "accounting",
                "block_weights", "non_private", "mode", "unit", "key_field", "max_records_per_key", "ledger_path"),
    "sampling": ("reservoir", "batch_size", "max_rejected_fraction", "reservoir_policy", "window_rate", "validation",
                 "sampling"),
    "schedule": ("every_records", "every_seconds", "tau0", "kappa", "rho_min"),
    "model": ("model_id",),
}


def _privacy_mode(options: Mapping[str, object]) -> dict[str, object]:
    """The options with Python's ``non_private`` turned into the configuration's ``mode``.

    ``non_private=True`` is the one Python spelling (as in :func:`stream_vips.fit`, the estimators
    and the command's ``--non-private``); ``privacy.mode`` is the configuration file's key. The
    older keyword ``mode=`` still works with a DeprecationWarning; both given and disagreeing is
    a one-line error, so a run never silently takes the private or the non-private reading."""
    from stream_vips.config import ConfigError

    o = dict(options)
    if "non_private" in o:
        flag = o.pop("non_private")
        if not isinstance(flag, (bool, np.bool_)):
            raise ConfigError(f"non_private: expected True or False, got {flag!r}")
        wanted = "non_private" if flag else "private"
        if "mode" in o and o["mode"] != wanted:
            raise ConfigError(f"non_private={bool(flag)} and mode={o['mode']!r} disagree; give only "
                              "non_private= (mode= is deprecated)")
        if "mode" not in o:
            o["mode"] = wanted
            return o
    if "mode" in o:
        instead = "non_private=True" if o["mode"] == "non_private" else "non_private=False (the default)"
        warnings.warn(f"PrivateLearner(mode={o['mode']!r}) is deprecated; write {instead} "
                      "(privacy.mode stays the configuration file's key)", DeprecationWarning, stacklevel=3)
    return o


def _check_options(family: str, options: Mapping[str, object]) -> None:
    """Refuse a keyword that is neither a learner option nor a parameter of the family, naming
    the closest of either and which it is (a typo of ``batch_size`` is not a model parameter)."""
    import inspect

    from stream_vips.config import ConfigError, close_match
    from stream_vips.models import model_class

    learner = {n for names in LEARNER_OPTIONS.values() for n in names}
    cls = model_class(family)
    params = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
    for name in options:
        if name not in learner and name in cls.retired_params:
            raise ConfigError(f"{name}: the {family} family no longer takes {name}; {cls.retired_params[name]}")
        if name not in learner and name not in params:
            hint = close_match(name, {"learner option": sorted(learner), f"{family} model parameter": params})
            raise ConfigError(f"{name}: neither a learner option nor a {family} model parameter{hint}")


def _notebook_config(family: str, options: Mapping[str, object]) -> dict[str, Any]:
    """Configuration data for keyword options, with notebook defaults: an in-memory ledger unless
    ``ledger_path`` is given, and no metrics. The reservoir keeps its configured capacity
    (``reservoir``, 10000 by default) whatever the data: the learner is built, and its noise
    calibrated for q = S/M, before any data arrive, and no step is taken before the reservoir is
    full (privacy rule 5). Data smaller than it give no model, which ``learn_many`` and
    ``posterior`` say; :func:`stream_vips.fit` uses a whole finite data set as its reservoir."""
    o = dict(options)
    privacy: dict[str, object] = {k: o.pop(k) for k in LEARNER_OPTIONS["privacy"] if k in o and k != "ledger_path"}
    path = o.pop("ledger_path", None)
    privacy["ledger"] = {"type": "file", "path": str(path)} if path else {"type": "memory"}
    sampling: dict[str, object] = {k: o.pop(k) for k in LEARNER_OPTIONS["sampling"] if k in o and k != "sampling"}
    if "sampling" in o:
        sampling["method"] = o.pop("sampling")
    schedule = {k: o.pop(k) for k in LEARNER_OPTIONS["schedule"] if k in o}
    model_id = o.pop("model_id", "default")
    return {"model": {"family": family, "id": model_id, "params": o}, "privacy": privacy, "sampling": sampling,
            "schedule": schedule, "metrics": {"enabled": False}, "runtime": {"on_halt": "exit"}}


def _parse(model: Model, objs: Sequence[object]) -> DecodedBatch:
    parsed = model.parse_batch(list(objs))
    ok = np.zeros(len(objs), dtype=bool)
    ok[np.asarray(parsed.accepted, dtype=np.intp)] = True
    return DecodedBatch(ok, parsed.rows, sorted(parsed.rejected))


def records_of(data: DataSet, field: str = "x") -> Iterable[Mapping[str, Any]]:
    """Record dicts from a list/iterable of dicts, ``(X, y)``, ``X``, or a pandas DataFrame: a
    lone ``X`` fills the family's vector ``field`` (``x``; ``y`` for sbn's images).

    A ``str`` or ``bytes`` is refused (:class:`~stream_vips.errors.DataError`): iterating it
    would make each character a record."""
    return _as_records(data, tabular(data), field)


def _as_records(data: DataSet, arrays: tuple[np.ndarray, np.ndarray | None] | None,
                field: str) -> Iterable[Mapping[str, Any]]:
    """:func:`records_of` once ``arrays = tabular(data)`` is known (read once per data set)."""
    if arrays is None:  # not array data: records (dicts, or raw documents that feed decodes)
        return iter(cast("Iterable[Mapping[str, Any]]", data))
    X, y = arrays
    if y is None:
        return ({field: xi} for xi in X.tolist())
    return ({"x": xi, "y": yi} for xi, yi in zip(X.tolist(), y.tolist()))


def _chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    part: list[Any] = []
    for item in items:
        part.append(item)
        if len(part) == size:
            yield part
            part = []
    if part:
        yield part
