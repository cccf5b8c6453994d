"""What a learner that releases through a :class:`~stream_vips.core.engine.PrivateEngine`
publishes: the ledger step of its newest release, the privacy section and the model message.
:class:`~stream_vips.core.learner.PrivateLearner` and the sharded driver
(:class:`stream_vips.distributed.driver.ShardedLearner`) both are such learners."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from stream_vips import messages
from stream_vips.core.engine import PrivateEngine
from stream_vips.models.base import Model
from stream_vips.models.posterior import with_summary


class Publishing(ABC):
    """The newest release as the service publishes it; a subclass holds ``model_id``, ``model``
    and ``engine`` and says when it is ``halted``."""

    model_id: str
    model: Model
    engine: PrivateEngine

    @property
    @abstractmethod
    def halted(self) -> bool:
        """True once no more releases will be made."""

    @property
    def last_step(self) -> int | None:
        """Ledger step (message version) of the newest release, ``None`` before the first."""
        return self.engine.last_step

    def privacy_report(self, halted: bool | None = None) -> dict[str, Any]:
        """The ``privacy`` section of the newest model message."""
        steps = 0 if self.last_step is None else self.last_step + 1
        return self.engine.privacy_report(steps=steps, halted=self.halted if halted is None else halted)

    def message(self, halted: bool | None = None) -> dict[str, Any] | None:
        """The newest model as a message (schema model-message.v1) with its posterior summary, computed
        from the message alone; ``None`` before any step."""
        last = self.last_step
        if last is None:
            return None
        return with_summary(messages.build_message(self.model_id, self.model.family, self.model.hyperparameters(),
                                                   last, self.model.state(), self.privacy_report(halted)))
