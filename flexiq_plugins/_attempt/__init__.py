"""Attempts: claiming a run, running its body, concluding into exactly one decision.

The driver (`flexiq_plugins._attempt.driver`) claims a run and starts an
[`Attempt`][flexiq_plugins.integration.Attempt]; the attempt keeps its lease
(`flexiq_plugins._attempt.lease`), and concludes with the compensations
(`flexiq_plugins._attempt.compensation`), cancellations and run caps the
run calls for. Every framework-neutral decision is made here, once, for every
adapter (`flexiq_plugins._attempt.decisions`).
"""
