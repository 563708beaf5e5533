"""``python -m app.cli``: the same entry point as the ``hyphae`` console script."""

import sys

from . import main

sys.exit(main())
