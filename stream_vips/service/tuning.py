"""How the process runs while :class:`~stream_vips.service.app.Application` consumes: Python's
cyclic garbage collector tuned for streaming batches, and BLAS pinned to a number of threads.
Both are context managers around the run loop that restore the process's settings afterwards.
"""

from __future__ import annotations

import gc
from typing import Any


class gc_tuned:
    """Keep Python's cyclic GC from rescanning the whole heap while records stream through.

    A polled batch keeps thousands of container objects (the client's records, decoded dicts
    and lists) alive until it is applied, so with the default thresholds they are promoted to
    the oldest generation and trigger full collections, each a walk over every object of the
    process (numpy, scipy and the accountant's modules included): about 2.5 s per million
    records, a fifth of the run. For the run, the objects that exist after start-up are frozen
    out of collection (``gc.freeze``) and the youngest generation's threshold is raised above
    what a batch keeps alive, so batches die young; reference cycles are still collected. The
    previous thresholds are restored and the frozen objects released afterwards.
    """

    def __init__(self, poll_max_records: int) -> None:
        self.threshold0 = max(gc.get_threshold()[0], 20 * poll_max_records)
        self._old: tuple[int, ...] = ()

    def __enter__(self) -> None:
        self._old = gc.get_threshold()
        gc.collect()
        gc.freeze()
        gc.set_threshold(self.threshold0, *self._old[1:])

    def __exit__(self, *exc: object) -> None:
        gc.set_threshold(*self._old)
        gc.unfreeze()


class blas_limit:
    """Pin BLAS threads (threadpoolctl) for the duration of the run; ``None`` leaves them."""

    def __init__(self, threads: int | None) -> None:
        self.threads = threads
        self._ctx: Any = None

    def __enter__(self) -> None:
        if self.threads is not None:
            from threadpoolctl import threadpool_limits

            self._ctx = threadpool_limits(limits=self.threads, user_api="blas")

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.restore_original_limits()
