"""Model families behind the common protocol in :mod:`stream_vips.models.base`."""
