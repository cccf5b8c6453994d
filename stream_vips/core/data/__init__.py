"""The data path of the core: record validation and decoding, the reservoirs (uniform, window,
key slots: one :class:`~stream_vips.core.data.reservoir.ReservoirLike` protocol), the minibatch
samplers and the update schedule. Membership and sampling depend on positions and a random
number generator only, never on record values (privacy rule 1)."""
