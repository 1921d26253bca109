"""The event log's schema, shared by whoever writes it and whoever reads it.

``kinds`` (the vocabulary), ``fact`` (a fact's encoding and decoding, and the ``RecordEvent`` command that writes
one), ``facts``, ``provider_facts`` and ``scheduler_facts`` (one frozen dataclass per kind) and ``schema``
(decoding a log's events).
Pure: the daemon's core imports it, and so does the client, which may import nothing of the daemon's.
"""
