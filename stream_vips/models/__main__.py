"""``python -m stream_vips.models --write-docs docs/families.md``: the families' page, made from the
registry (:func:`stream_vips.models.registry.main`)."""

import sys

from stream_vips.models.registry import main

sys.exit(main())
