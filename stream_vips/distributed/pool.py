"""Where the shards run: in this process (:class:`LocalPool`) or as Ray actors (:class:`RayPool`).

The driver calls every shard with one method and per-shard arguments and gets their answers in
shard order, or a :class:`ShardFailure` (a shard that raised, died or did not answer within the
timeout). Ray is imported only when a :class:`RayPool` is made, so the rest of the package (and
everything below it) runs without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from stream_vips.config import Config
from stream_vips.distributed.shard import Shard
from stream_vips.errors import StreamVipsError
from stream_vips.io import DeadLetterSink, Source

#: shard index -> a factory of that shard's source (or dead-letter sink), called on the shard
SourceFactory = Callable[[int], Callable[[], Source] | None]
DeadLetterFactory = Callable[[int], Callable[[], DeadLetterSink] | None]
#: the custom Ray resource a node declares to host shards (k8s/overlays/ray: one per worker pod)
SHARD_RESOURCE = "stream_vips_shard"


def shard_actor_options(cluster_resources: Mapping[str, float]) -> dict[str, Any]:
    """A shard actor's Ray options on a cluster with ``cluster_resources``: no CPU of its own, and
    one unit of :data:`SHARD_RESOURCE` when some node declares it, so shards run only on the
    nodes meant for them (the workers) and never beside the driver on the head. A cluster
    without it (a local ``ray.init()``) places them anywhere."""
    if cluster_resources.get(SHARD_RESOURCE, 0) >= 1:
        return {"num_cpus": 0, "resources": {SHARD_RESOURCE: 1}}
    return {"num_cpus": 0}


class ShardFailure(StreamVipsError, RuntimeError):
    """A shard raised, died or did not answer in time; ``index`` names it (None: unknown)."""

    def __init__(self, message: str, index: int | None = None, cause: str = "error") -> None:
        super().__init__(message)
        self.index = index
        self.cause = cause  # "error" | "lost" | "timeout"


class ShardPool(Protocol):
    """N shards the driver can call together."""

    shards: int

    def call(self, method: str, args: Sequence[tuple[Any, ...]], timeout_s: float | None = None) -> list[Any]: ...

    def share(self, value: Any) -> Any:
        """``value`` as an argument every shard can take (sent once, not once per shard)."""
        ...

    def close(self) -> None: ...


def _no_source(index: int) -> None:
    return None


class LocalPool:
    """The shards as objects in this process, called one after the other (the reference run)."""

    def __init__(self, cfg: Config, shards: int, sources: SourceFactory = _no_source,
                 dead_letters: DeadLetterFactory = _no_source, shard_class: type[Shard] = Shard) -> None:
        self.shards = shards
        self.members: list[Shard] = []
        try:
            for i in range(shards):
                self.members.append(shard_class(cfg, i, shards, sources(i), dead_letters(i)))
        except BaseException:  # a shard that cannot open its connectors: close the ones opened
            self.close()
            raise

    def share(self, value: Any) -> Any:
        """In one process the value itself."""
        return value

    def call(self, method: str, args: Sequence[tuple[Any, ...]], timeout_s: float | None = None) -> list[Any]:
        """Each shard's ``method(*args[i])``; a shard's exception as :class:`ShardFailure`."""
        out = []
        for shard, a in zip(self.members, args, strict=True):
            try:
                out.append(getattr(shard, method)(*a))
            except StreamVipsError:
                raise
            except Exception as exc:
                raise ShardFailure(f"shard {shard.index} failed in {method}: {exc}", shard.index) from exc
        return out

    def close(self) -> None:
        for shard in self.members:
            shard.close()


class RayPool:
    """The shards as Ray actors (one per shard, restarted by Ray up to ``max_restarts`` times: a
    restarted shard starts empty, so no step is taken until its slice is full again), placed by
    :func:`shard_actor_options` unless ``actor_options`` says otherwise."""

    def __init__(self, cfg: Config, shards: int, sources: SourceFactory = _no_source,
                 dead_letters: DeadLetterFactory = _no_source, shard_class: type[Shard] = Shard,
                 max_restarts: int = 3, actor_options: dict[str, Any] | None = None,
                 start_timeout_s: float = 300.0) -> None:
        import ray

        self.shards = shards
        options = actor_options or shard_actor_options(ray.cluster_resources())
        actor: Any = ray.remote(shard_class).options(max_restarts=max_restarts, max_task_retries=0, **options)
        self.actors: list[Any] = [actor.remote(cfg, i, shards, sources(i), dead_letters(i)) for i in range(shards)]
        # started (a worker process, the imports, the shard's connectors) before any timed call
        try:
            self.call("status", [()] * shards, start_timeout_s)
        except BaseException:  # a refused start, a shard's own error, an interrupt
            self.close()  # the shards that did start hold connectors: none is left behind
            raise

    def share(self, value: Any) -> Any:
        """The value put in Ray's object store once: every actor called with the reference reads the
        same copy (passed by value, the driver would serialise it once per shard)."""
        import ray

        return ray.put(value)

    def call(self, method: str, args: Sequence[tuple[Any, ...]], timeout_s: float | None = None) -> list[Any]:
        """Each actor's ``method(*args[i])`` in parallel, all within ``timeout_s``."""
        import ray
        from ray import exceptions as rex

        refs = [getattr(actor, method).remote(*a) for actor, a in zip(self.actors, args, strict=True)]
        try:
            return list(ray.get(refs, timeout=timeout_s))
        except rex.GetTimeoutError as exc:
            for ref in refs:
                ray.cancel(ref)
            raise ShardFailure(f"a shard did not answer {method} within {timeout_s} s "
                               "(runtime.shard_timeout_s)", cause="timeout") from exc
        except rex.RayActorError as exc:
            if exc.actor_init_failed:  # its constructor raised (e.g. a connector it could not open): final
                raise ShardFailure(f"a shard could not start: {_last_line(exc)}") from exc
            raise ShardFailure(f"a shard died during {method}: {exc}", cause="lost") from exc
        except rex.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, StreamVipsError):
                raise cause from exc
            raise ShardFailure(f"a shard failed in {method}: {cause}") from exc

    def close(self) -> None:
        import ray

        for actor in self.actors:
            try:
                ray.get(actor.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a dead shard has nothing to close
                pass
            ray.kill(actor, no_restart=True)


def _last_line(exc: BaseException) -> str:
    """The raised exception's own line from a Ray error (its message ends with the remote traceback,
    whose last line is ``Type: message``)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__
