"""``python -m streamrank.cli``: the same as the ``streamrank`` command."""

import sys

from streamrank.cli.main import main

sys.exit(main())
