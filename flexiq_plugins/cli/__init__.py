"""The ``flexiq`` console script (``flexiq = "flexiq_plugins.cli:main"``).

The commands live in ``flexiq_plugins.cli``; the same operations are a Python
API in [`flexiq_plugins.operations`][flexiq_plugins.operations]. See ``docs/operations.md``.
"""

from ._main import cli, main
from ._state import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE

__all__ = ["EXIT_FAILED", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "cli", "main"]
