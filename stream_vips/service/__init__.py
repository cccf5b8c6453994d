"""The streaming service around the core: :mod:`.app` (the run loop: sources, sinks, commits,
publishing, signals), :mod:`.build` (the only place that picks connectors and ledgers from a
configuration), :mod:`.checkpoint` (the reservoir checkpoint, an explicit hook of the run loop)
and :mod:`.metrics` (Prometheus)."""
