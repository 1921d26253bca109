"""What the Azure provider does with its scale set, decided without the SDK: pure functions and values.

:mod:`controller.providers.azure` is the shell: it lists the set, asks :func:`plan_scale` what to do,
and does it (delete evicted leftovers, scale out, scale in idle instances). The capacity it aims for
is :func:`scaling.desired_capacity`: the operator's ``target_capacity`` as a floor, raised to what the
controller asks for (:meth:`Provider.request_capacity`, busy nodes plus queued jobs) up to
``max_capacity``. Because the controller's level counts every busy node, scale-in only ever finds idle
instances above it; busy ones are spared regardless (unless the operator allows deleting them).
Backoff, failures, the busy-node rule and the token bookkeeping are every cloud's
(:mod:`controller.providers.scaling`); this module holds what is Azure's: a scale-set VM and the plan.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from controller.providers.scaling import CLEAN, SCALE, Backoff

GONE_POWER = frozenset({"deallocated", "deallocating", "stopped", "stopping"})


@dataclass(frozen=True)
class Instance:
    name: str  # the VM name, which is the node name its agent registers under
    instance_id: str  # what delete_instances takes (Uniform: "3"; Flexible: the VM name)
    provisioning: str
    power: str
    location: str = ""  # the VM's region: a Run Command on it names it

    @property
    def running(self) -> bool:
        """Provisioned and powered on: its VM agent can take a Run Command."""
        return self.provisioning.lower() == "succeeded" and self.power == "running"

    @property
    def evicted(self) -> bool:
        return self.power in GONE_POWER or self.provisioning.lower() == "deleting"


@dataclass(frozen=True)
class ScaleOut:
    running: int  # instances alive now
    dying: int  # listed but evicted: they still count in the set's capacity until deleted


@dataclass(frozen=True)
class ScalePlan:
    clean: tuple[Instance, ...] = ()  # evicted instances still in the set: delete them
    scale_out: ScaleOut | None = None
    scale_in: tuple[Instance, ...] = ()  # idle instances above the desired capacity: delete them
    deferred: int = 0  # instances above the desired capacity kept because their nodes run jobs


def plan_scale(
    listed: Sequence[Instance],
    desired: int,
    busy: Collection[str],
    *,
    delete_busy: bool,
    pending: Collection[str],
    now: float,
    backoff: Backoff,
) -> ScalePlan:
    """What to start after a list; nothing while backing off or while the same kind of operation runs."""
    if not backoff.may_change(now):
        return ScalePlan()
    evicted = tuple(i for i in listed if i.evicted and i.provisioning.lower() != "deleting")
    alive = [i for i in listed if not i.evicted]
    clean = evicted if evicted and CLEAN not in pending else ()
    if SCALE in pending or len(alive) == desired:
        return ScalePlan(clean)
    if len(alive) < desired:
        return ScalePlan(clean, ScaleOut(len(alive), len(listed) - len(alive)))
    extra = len(alive) - desired
    idle = tuple(i for i in reversed(alive) if delete_busy or i.name not in busy)[:extra]
    return ScalePlan(clean, scale_in=idle, deferred=extra - len(idle))


def capacity_to_set(current: int, desired: int, dying: int) -> int | None:
    """The set's new capacity for a scale-out, or None when it is already that high.

    Instances on their way out still count in the set's capacity until they are gone; a capacity
    already asked for (by this controller before a restart, or an operation still running) is left alone.
    """
    wanted = desired + dying
    return None if current >= wanted else wanted
