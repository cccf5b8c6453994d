"""Synthetic records for demos, tests and benchmarks: any registered family's synthetic data
(:attr:`stream_vips.models.base.Model.synthetic`), streamed as a source.

:class:`SyntheticSource` takes the family and the generator's options; a fraction of the records
can be replaced by the generator's malformed lines, cycling through them, so a demo shows the
dead-letter path. The source types a configuration names are the family-bound classes of
:data:`BOUND` (``SyntheticRegressionSource``: linreg, ``SyntheticLogisticSource``: logistic,
``SyntheticLdaSource``: lda, ``SyntheticSbnSource``: sbn, ``SyntheticNonlinearSource``: sep_bnn),
whose keyword arguments are the common ones and the generator's options, checked like every
connector's. The source answers for its data: ``source.weights`` is the generator's truth.

>>> src = SyntheticSource("linreg", count=3, dimension=2, seed=0)
>>> [len(r.value) > 0 for r in src.poll(10, 0.0)], src.exhausted, src.weights.shape
([True, True, True], True, (2,))
>>> docs = SyntheticSource("lda", count=2, n_topics=2, vocabulary_size=10, doc_length=5, seed=0)
>>> [r.value[:11] for r in docs.poll(10, 0.0)]
[b'{"tokens": ', b'{"tokens": ']
"""

from __future__ import annotations

import functools
import inspect
import time
import typing
from typing import Any

import numpy as np

from connectors._lines import PausableSource
from stream_vips.io import RawRecord
from stream_vips.models.registry import model_class

#: Source class name -> the family whose synthetic data it streams (the configuration's types).
BOUND: dict[str, str] = {
    "SyntheticRegressionSource": "linreg",
    "SyntheticLogisticSource": "logistic",
    "SyntheticLdaSource": "lda",
    "SyntheticSbnSource": "sbn",
    "SyntheticNonlinearSource": "sep_bnn",
}


class SyntheticSource(PausableSource):
    """Generates ``count`` records (``None``: unbounded) of ``family``'s synthetic data.

    ``options`` go to the family's generator (which draws its truth from ``seed`` first);
    ``malformed_fraction`` of the records are replaced by its malformed lines;
    ``records_per_second`` throttles the stream (``None``: as fast as polled).
    """

    def __init__(self, family: str, count: int | None = None, seed: int = 0, malformed_fraction: float = 0.0,
                 records_per_second: float | None = None, **options: Any) -> None:
        if count is not None and int(count) < 0:
            raise ValueError(f"count must be >= 0 or null, got {count}")
        if not 0.0 <= float(malformed_fraction) <= 1.0:
            raise ValueError(f"malformed_fraction must be in [0, 1], got {malformed_fraction}")
        if records_per_second is not None and float(records_per_second) <= 0:
            raise ValueError(f"records_per_second must be > 0 or null, got {records_per_second}")
        generator = model_class(family).synthetic
        if generator is None:
            raise ValueError(f"the {family} family has no synthetic data")
        self.family = family
        self.count = None if count is None else int(count)
        self.malformed_fraction = float(malformed_fraction)
        self.records_per_second = None if records_per_second is None else float(records_per_second)
        self._rng = np.random.default_rng(seed)
        self.data = generator(self._rng, **options)
        self._produced = 0
        self._started = time.monotonic()

    def __getattr__(self, name: str) -> Any:
        """The generator's truth and draws (``weights``, ``topics``, ``sample``, ...)."""
        if name == "data":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.data, name)

    def total(self) -> int | None:
        """``count`` (``None``: endless)."""
        return self.count

    def generate(self, n: int) -> list[bytes]:
        """The next ``n`` records as JSON lines (advances the generator)."""
        lines = self.data.records(n)
        if self.malformed_fraction > 0:
            malformed = self.data.malformed
            bad = np.flatnonzero(self._rng.random(n) < self.malformed_fraction)
            for j, i in enumerate(bad.tolist()):
                lines[i] = malformed[(self._produced + j) % len(malformed)]
        self._produced += n
        return lines

    def poll(self, max_records: int, timeout_s: float) -> list[RawRecord]:
        if self.paused or self.exhausted:
            return []
        n = max_records
        if self.count is not None:
            n = min(n, self.count - self._produced)
        if self.records_per_second is not None:
            due = int((time.monotonic() - self._started) * self.records_per_second) - self._produced
            if due <= 0:
                time.sleep(min(timeout_s, 1.0 / self.records_per_second))
                due = int((time.monotonic() - self._started) * self.records_per_second) - self._produced
            n = max(0, min(n, due))
        start = self._produced
        return [RawRecord(v, {"offset": start + i}) for i, v in enumerate(self.generate(n))]

    def commit(self) -> None:
        """A generator has nothing to commit."""

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self._produced >= self.count

    def close(self) -> None:
        """Nothing to release."""


@functools.cache
def bound(family: str, name: str) -> type[SyntheticSource]:
    """:class:`SyntheticSource` bound to ``family`` as class ``name``: its constructor takes
    ``count``, the generator's options, ``seed``, ``malformed_fraction`` and ``records_per_second``
    (positionally in that order, or as keywords), and states them in its signature and type hints
    so that a configuration's keys are checked against them."""
    generator = model_class(family).synthetic
    if generator is None:
        raise ValueError(f"the {family} family has no synthetic data")
    common = inspect.signature(SyntheticSource.__init__).parameters
    own = [p for n, p in inspect.signature(generator.__init__).parameters.items() if n not in ("self", "rng")]
    signature = inspect.Signature([common["self"], common["count"], *own, common["seed"],
                                   common["malformed_fraction"], common["records_per_second"]])
    hints = {**typing.get_type_hints(SyntheticSource.__init__), **typing.get_type_hints(generator.__init__)}

    def __init__(self: SyntheticSource, *args: Any, **kwargs: Any) -> None:
        given = signature.bind(self, *args, **kwargs)
        given.apply_defaults()
        values = dict(given.arguments)
        del values["self"]
        SyntheticSource.__init__(self, family, values.pop("count"), values.pop("seed"),
                                 values.pop("malformed_fraction"), values.pop("records_per_second"), **values)

    __init__.__signature__ = signature  # type: ignore[attr-defined]
    __init__.__annotations__ = {n: hints[n] for n in signature.parameters if n in hints} | {"return": None}
    doc = f"Generates ``count`` records (``None``: unbounded) of the {family} family's synthetic data:\n\n" \
          f"{inspect.getdoc(generator)}"
    return type(name, (SyntheticSource,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


def __getattr__(name: str) -> type[SyntheticSource]:
    """The family-bound source classes of :data:`BOUND`, made on first use."""
    if name in BOUND:
        return bound(BOUND[name], name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
