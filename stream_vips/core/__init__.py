"""The I/O-free core: a :class:`~stream_vips.core.learner.PrivateLearner` and what it is built of.

:mod:`.learner` (feed, step, message, state), :mod:`.build` (a configuration turned into the
learner's parts), :mod:`.keys` (privacy units of arrivals), :mod:`.engine` (one private step, split
at the privacy wall into a contribution and its release) and :mod:`.data` (records, decoding,
reservoirs, sampling, schedule). Nothing here reads a network, a file or a clock-driven trigger
of its own: the service (:mod:`stream_vips.service`) and ``fit`` (:mod:`stream_vips.fitting`)
drive it.
"""
