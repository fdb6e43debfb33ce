"""``python -m outcore.cli``: the ``outcore`` command."""

import sys

from .main import main

sys.exit(main())
