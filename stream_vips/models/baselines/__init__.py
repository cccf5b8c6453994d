"""Baselines from the seed papers, streamed behind the same engine, budget monitor and ledger.

* :mod:`.dpvi`: DPVI (Jälkö, MSc thesis, Algorithm 1), doubly stochastic VI with per-record
  gradient clipping, Gaussian noise and AdaGrad, diagonal Gaussian posterior.
* :mod:`.sgld`: DP-SGLD (Wang, Fienberg & Smola, ICML 2015, Algorithm 2 / Theorem 4).
* :mod:`.ops`: the one-posterior-sample estimator (same paper, Algorithm 1 / Theorem 1), a pure
  epsilon-DP exponential mechanism released through :class:`~stream_vips.privacy.events.PureDpEvent`.

All three are Bayesian logistic regression on records ``{"x": [d numbers], "y": 0 | 1}`` with
exactly the record handling of :class:`~stream_vips.models.logistic.BayesianLogisticRegression`
(x clipped to L2 norm 1, y in {0, 1}); :class:`LogisticRecords` shares it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from stream_vips.models._validate import integer
from stream_vips.models.base import Model
from stream_vips.models.logistic import BayesianLogisticRegression, LogisticData
from stream_vips.models.synthetic import SyntheticData


class LogisticRecords(Model):
    """Record layout and parsing of the VIPS logistic family (one implementation, reused).

    Parameters shared by the baselines:

    - ``dim``: d, the length of a record's ``x``;
    - ``dataset_size``: N, the reservoir capacity (fit's N).
    """

    record_format: ClassVar[str] = BayesianLogisticRegression.record_format
    row_layout = BayesianLogisticRegression.row_layout
    parse_batch = BayesianLogisticRegression.parse_batch
    synthetic: ClassVar[type[SyntheticData]] = LogisticData

    def _init_records(self, dim: int, dataset_size: int) -> None:
        self.dim = integer("dim", dim)
        self.dataset_size = integer("dataset_size", dataset_size)
        self.dtype = np.dtype(np.float64)  # stored input precision, read by the shared record handling

    def _batch_xy(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Rows re-clipped to norm 1 (idempotent for parsed rows) and labels as +-1 floats."""
        from stream_vips.privacy.mechanisms import clip_rows

        X = clip_rows(np.asarray(batch["x"], dtype=float), 1.0)
        y = np.asarray(batch["y"], dtype=float)
        if X.ndim != 2 or X.shape[1] != self.dim or y.shape != (X.shape[0],):
            raise ValueError(f"batch must hold x of shape (n, {self.dim}) and y of shape (n,), "
                             f"got {X.shape} and {y.shape}")
        return X, y
