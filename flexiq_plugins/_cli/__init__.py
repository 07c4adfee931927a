"""The ``flexiq`` command line, one module per command group; ``flexiq_plugins.cli`` is its public face."""
