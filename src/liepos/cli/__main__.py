"""``python -m liepos.cli``: the same as the ``liepos`` command."""

import sys

from liepos.cli import main

sys.exit(main())
