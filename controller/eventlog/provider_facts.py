"""What each event a provider (or the runner's call to one) reports says: one frozen dataclass per kind.

The controller's own decisions say theirs with :mod:`controller.eventlog.facts`; these are the provider side of
the same vocabulary, reported through :class:`controller.providers.base.ProviderPort` and logged by the next
decision. A field a cloud may not give is optional (left out of the data while None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from controller.eventlog.fact import Fact
from controller.eventlog.kinds import EventKind

K = EventKind


@dataclass(frozen=True)
class CapacityRequested(Fact):
    kind = K.CAPACITY_REQUESTED
    slots: int


@dataclass(frozen=True)
class ProviderCapacityRequestFailed(Fact):
    kind = K.PROVIDER_CAPACITY_REQUEST_FAILED
    slots: int
    error: str


@dataclass(frozen=True)
class ProviderReleaseFailed(Fact):
    kind = K.PROVIDER_RELEASE_FAILED
    node: str
    error: str


@dataclass(frozen=True)
class LocalVmsStarted(Fact):
    kind = K.LOCAL_VMS_STARTED
    vms: list[str]
    slots: int
    message: str


@dataclass(frozen=True)
class ScaleSetFact(Fact):
    """An event about one Azure scale set, said in words (``message``) an operator can act on."""

    scale_set: str
    message: str


@dataclass(frozen=True)
class ProviderScaleOut(ScaleSetFact):
    kind = K.PROVIDER_SCALE_OUT
    capacity: int


@dataclass(frozen=True)
class ProviderScaleOutDone(ScaleSetFact):
    kind = K.PROVIDER_SCALE_OUT_DONE
    capacity: int


@dataclass(frozen=True)
class ProviderDeleteInstances(ScaleSetFact):
    kind = K.PROVIDER_DELETE_INSTANCES
    instances: list[str]


@dataclass(frozen=True)
class ProviderScaleInDeferred(ScaleSetFact):
    kind = K.PROVIDER_SCALE_IN_DEFERRED


@dataclass(frozen=True)
class ProviderCapacityLimited(ScaleSetFact):
    kind = K.PROVIDER_CAPACITY_LIMITED
    wanted: int
    capacity: int


@dataclass(frozen=True)
class ProviderReleaseRefused(ScaleSetFact):
    kind = K.PROVIDER_RELEASE_REFUSED
    node: str


@dataclass(frozen=True)
class ProviderAgentTokenDelivered(ScaleSetFact):
    kind = K.PROVIDER_AGENT_TOKEN_DELIVERED
    node: str


@dataclass(frozen=True)
class ProviderAgentTokenFailed(ScaleSetFact):
    kind = K.PROVIDER_AGENT_TOKEN_FAILED
    node: str
    retry_at: float


@dataclass(frozen=True)
class ProviderCallFailed(ScaleSetFact):
    """A call to the cloud failed: which operation, and when the provider tries again (None: at once)."""

    optional: ClassVar[frozenset[str]] = frozenset({"retry_at"})
    operation: str
    retry_at: float | None


@dataclass(frozen=True)
class ProviderThrottled(ProviderCallFailed):
    kind = K.PROVIDER_THROTTLED


@dataclass(frozen=True)
class ProviderCapacityUnavailable(ProviderCallFailed):
    kind = K.PROVIDER_CAPACITY_UNAVAILABLE


@dataclass(frozen=True)
class ProviderConflict(ProviderCallFailed):
    kind = K.PROVIDER_CONFLICT


@dataclass(frozen=True)
class ProviderNotFound(ProviderCallFailed):
    kind = K.PROVIDER_NOT_FOUND


@dataclass(frozen=True)
class ProviderAuthFailed(ProviderCallFailed):
    kind = K.PROVIDER_AUTH_FAILED


@dataclass(frozen=True)
class ProviderUnreachable(ProviderCallFailed):
    kind = K.PROVIDER_UNREACHABLE


@dataclass(frozen=True)
class ProviderError(ProviderCallFailed):
    kind = K.PROVIDER_ERROR


CALL_FAILURES: dict[EventKind, type[ProviderCallFailed]] = {
    cls.kind: cls for cls in ProviderCallFailed.__subclasses__()
}
