"""Eviction notices and early warnings from the cloud the agent runs on, in one vocabulary (:mod:`.facts`).

Each cloud says it its own way: Azure's Scheduled Events (:mod:`worker_agent.scheduled_events`, adapted in
:mod:`.azure`), AWS's instance metadata (:mod:`.aws`: the Spot instance-action and the rebalance
recommendation) and GCP's metadata server (:mod:`.gcp`: the preempted flag, and the guest's shutdown).
:func:`.sources.notice_source` picks one for ``spotmorph agent --cloud``.
"""
