"""Attempts: claiming a run, running its body, concluding into exactly one decision.

The driver (:mod:`flexiq_plugins._attempt.driver`) claims a run and starts an
:class:`~flexiq_plugins._attempt.attempt.Attempt`; the attempt keeps its lease
(:mod:`flexiq_plugins._attempt.lease`), and concludes with the compensations
(:mod:`flexiq_plugins._attempt.compensation`), cancellations and run caps the
run calls for. Every framework-neutral decision is made here, once, for every
adapter (:mod:`flexiq_plugins._attempt.decisions`).
"""
