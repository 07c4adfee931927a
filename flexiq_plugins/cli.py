"""The ``flexiq`` console script (``flexiq = "flexiq_plugins.cli:main"``).

The commands live in ``flexiq_plugins._cli``; the same operations are a Python
API in :mod:`flexiq_plugins.operations`. See ``docs/operations.md``.
"""

from ._cli.main import cli, main
from ._cli.state import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_FAILED", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "cli", "main"]
