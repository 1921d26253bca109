"""Why a call was refused, as a typed word both sides share: the gRPC trailing metadata key ``spotmorph-reason``.

The status message is for people and may change; an agent decides on the status code and this word. It
lives beside the generated stubs because the controller and the agent both depend on them and on nothing
else of each other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REASON_KEY = "spotmorph-reason"
REGISTER_AGAIN = "register-again"  # the node's token or incarnation is not its current one: register, then go on
# A standby controller refuses every write (FAILED_PRECONDITION) with this reason and names the leader it knows
# under LEADER_KEY ("HOST:PORT"; empty while no controller leads): the caller sends the call there.
NOT_LEADER = "not-leader"
LEADER_KEY = "spotmorph-leader"


def leader_of(metadata: Iterable[Any] | None) -> str:
    """The leader a standby's refusal names ('' when it names none)."""
    for key, value in metadata or ():
        if key == LEADER_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return ""


def reason_of(metadata: Iterable[Any] | None) -> str:
    """The reason word in a call's trailing metadata, ``(key, value)`` pairs ('' when there is none)."""
    for key, value in metadata or ():
        if key == REASON_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return ""
