"""Model families behind the common protocol in :mod:`stream_vips.models.base`; the registry of
families is :mod:`stream_vips.models.registry` (its public names are re-exported here)."""

from stream_vips.models.registry import MODEL_FAMILIES, dimension, model_class

__all__ = ["MODEL_FAMILIES", "dimension", "model_class"]
