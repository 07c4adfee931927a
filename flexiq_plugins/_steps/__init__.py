"""The step API and the one step protocol: ``current_job``, ``StepContext``, the journal and one module per verb.

A verb (``run``, ``sleep``, ``transaction``, ``wait_for_event``) says how its
memo replays, how a new step executes and what it commits; the journal
(`flexiq_plugins._steps.journal`) does the rest once for all of them.
This layer never sees a claim or a framework: it commits through a writer the
attempt fences on its claim.
"""
