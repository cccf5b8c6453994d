"""``python -m stream_vips.cli``: the ``stream-vips`` command."""

import sys

from stream_vips.cli import main

sys.exit(main())
