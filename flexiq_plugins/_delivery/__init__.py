"""Delivery: getting a run's job to a worker, and again when its message is lost.

Recording a run at publish (`flexiq_plugins._delivery.recording`), the
adapter registry and publishers, re-publishing through a run's own framework
(`flexiq_plugins._delivery.publishing`), recovery, waking runs for
events, cancelling, and what a worker does when it starts or meets a task it
does not have.
"""
