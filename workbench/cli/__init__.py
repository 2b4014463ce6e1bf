"""The ``streamrank`` command line: one module per command group, registered in
:mod:`workbench.cli.main`. The top layer: nothing below imports it."""
