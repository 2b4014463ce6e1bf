"""``python -m workbench.cli``: the same as the ``streamrank`` command."""

import sys

from workbench.cli.main import main

sys.exit(main())
