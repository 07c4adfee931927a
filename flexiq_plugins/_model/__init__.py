"""The words of the core: records, step identity, durations, codecs, policies, options, failures, replays.

The lowest layer: plain values and pure functions, no I/O. Every layer above
reads these; this package imports only [`flexiq_plugins.errors`][flexiq_plugins.errors].
"""
