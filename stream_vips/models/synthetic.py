"""Synthetic records of a family, drawn from a known model so that a run can be scored against the truth.

A family names its generator in :attr:`~stream_vips.models.base.Model.synthetic`: a
:class:`SyntheticData` subclass built as ``cls(rng, **options)``, which draws its truth from
``rng`` and then, per call of :meth:`SyntheticData.records`, the next ``n`` well-formed records as
JSON lines from the same generator. :class:`connectors.synthetic.SyntheticSource` streams any
family's records and mixes in the generator's ``malformed`` lines (the dead-letter path); a family
whose synthetic data has a ``stream-vips demo`` describes it in a :class:`Demo`. The shared pieces
of the families whose records are vectors live here too.

>>> fill('{"x": [NaN%s], "y": 0.5}', 3)
'{"x": [NaN, 0.1, 0.1], "y": 0.5}'
>>> vector_lines(np.array([[0.5, -1.0]]), [2.0])
[b'{"x": [0.5, -1.0], "y": 2.0}']
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

if TYPE_CHECKING:
    from stream_vips.models.base import Model

#: Malformed vector records: kind -> template (``%s`` is filled up to the dimension). None is a
#: valid record of any family that reads ``{"x": [d numbers], ...}``.
MALFORMED_KINDS: dict[str, str] = {
    "bad_json": '{"x": [0.1, 0.2',
    "nan": '{"x": [NaN%s], "y": 0.5}',
    "wrong_shape": '{"x": [0.1%s, 0.1], "y": 0.5}',
    "huge": '{"x": [1e400%s], "y": 0.5}',
    "wrong_type": '{"x": "not a vector", "y": 0.5}',
    "not_object": "[1, 2, 3]",
}


def fill(template: str, dimension: int) -> str:
    """A :data:`MALFORMED_KINDS` template with its ``%s`` filled up to ``dimension`` entries."""
    return template % (", 0.1" * (dimension - 1)) if "%s" in template else template


def malformed_vectors(dimension: int) -> tuple[bytes, ...]:
    """Every :data:`MALFORMED_KINDS` line at ``dimension``."""
    return tuple(fill(t, dimension).encode() for t in MALFORMED_KINDS.values())


def vector_lines(x: np.ndarray, y: Sequence[float]) -> list[bytes]:
    """``{"x": [...], "y": ...}`` lines of the rows of ``x`` and the values ``y`` (Python reprs)."""
    return [b'{"x": [%s], "y": %r}' % (", ".join(map(repr, row)).encode(), yi) for row, yi in zip(x.tolist(), y)]


def check_dimension(dimension: Any, minimum: int = 1, why: str = "") -> int:
    """``dimension`` as an int, or a ValueError unless it is at least ``minimum``."""
    if int(dimension) < minimum:
        raise ValueError(f"dimension must be >= {minimum}{why}, got {dimension}")
    return int(dimension)


def check_weights(weights: Sequence[float], dimension: int) -> np.ndarray:
    """Given true weights as an array of length ``dimension`` (a ValueError otherwise)."""
    w = np.asarray(weights, dtype=float)
    if w.shape != (dimension,):
        raise ValueError(f"weights must have length {dimension}, got {w.shape}")
    return w


class SyntheticData(ABC):
    """A family's known model and the records drawn from it.

    Subclasses take their options as keyword arguments after ``rng`` (a source's configuration
    keys: they are checked against the signature), draw the truth from ``rng`` in ``__init__``,
    keep it as attributes (for scoring) and set ``malformed``: lines the family rejects.
    """

    malformed: tuple[bytes, ...]

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng

    @abstractmethod
    def records(self, n: int) -> list[bytes]:
        """The next ``n`` well-formed records as JSON lines (advances the generator)."""

    @property
    @abstractmethod
    def model_params(self) -> dict[str, Any]:
        """The public model parameters that make the family read these records (its dimension
        parameter, or the vocabulary)."""


class VectorData(SyntheticData):
    """Synthetic ``{"x": [...], "y": ...}`` records of a vector family whose dimension parameter is
    ``dim``: a subclass draws ``(X, y)`` in :meth:`sample`."""

    dimension: int

    @abstractmethod
    def sample(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` fresh rows ``X`` (n x dimension) and their targets ``y`` (advances the generator)."""

    def records(self, n: int) -> list[bytes]:
        X, y = self.sample(n)
        return vector_lines(X, y.tolist())

    @property
    def model_params(self) -> dict[str, Any]:
        return {"dim": self.dimension}


def _nothing_held_out(data: SyntheticData) -> None:
    return None


#: The family's model and synthetic data that a :class:`Demo` scores (``Demo[LinearRegression, RegressionData]``).
ModelT = TypeVar("ModelT", bound="Model")
DataT = TypeVar("DataT", bound=SyntheticData)


@dataclass(frozen=True)
class Demo(Generic[ModelT, DataT]):
    """What ``stream-vips demo`` streams for a family and how it scores the result.

    The demo streams ``records`` records of the family's synthetic data (generator options
    ``source``) into a reservoir of ``reservoir`` records, sampled at ``batch_size / reservoir``
    and updated every ``every_records`` records with rho_t = (1 + t)^-``kappa``. ``params(data,
    seed)`` gives the model's parameters from the data's public parts; ``held_out(data)`` draws
    fresh records after the run; ``score(model, data, held_out)`` gives the family's metrics of
    one run (keys without prefix; the non-private run's are reported with ``non_private_``),
    ``reference(data, held_out)`` the truth's, and ``lines(summary)`` the summary's family lines.
    ``about`` says in one line what is streamed and scored.
    """

    about: str
    source: Mapping[str, Any]
    params: Callable[[DataT, int], dict[str, Any]]
    score: Callable[[ModelT, DataT, Any], dict[str, float]]
    reference: Callable[[DataT, Any], dict[str, Any]]
    lines: Callable[[Mapping[str, Any]], list[str]]
    held_out: Callable[[DataT], Any] = _nothing_held_out
    records: int = 40_000
    reservoir: int = 10_000
    batch_size: int = 2_000
    every_records: int = 1_000
    kappa: float = 0.7
