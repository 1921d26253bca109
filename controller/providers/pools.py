"""Pools for a cloud provider over one group of VMs per pool kind: spot always, on-demand where configured.

Each cloud provider class (:mod:`.azure`, :mod:`.aws`, :mod:`.gcp`) drives one group: its scale set, Auto Scaling
group or managed instance group (``list_group``, ``request_group``, ``release_group``, ``close_group``). The one
the controller holds is its spot group's; where the operator set up an on-demand group, it holds a second
provider of the same class over that group (``on_demand``, floor 0, its own backoff and operations), and this
base routes the :class:`~controller.providers.base.Provider` protocol between the two: a level to its pool's
group, a release to the group that listed the instance, one list of both (or none: :class:`CannotList`).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Mapping
from types import MappingProxyType

from controller.providers.base import refuse_pool
from scheduler.pools import PoolKind


class PooledGroups(ABC):
    """A provider over its own group (spot), and over an on-demand group's provider where there is one."""

    on_demand: PooledGroups | None = None  # the on-demand group's provider (its own ``on_demand`` is None)
    on_demand_setting: str = "an on-demand group in the provider's settings"  # how an operator adds one
    _pools: Mapping[str, PoolKind] = MappingProxyType({})  # the last list: each instance's pool

    @abstractmethod
    async def list_group(self) -> frozenset[str]:
        """This group's instances that exist now; raises CannotList."""

    @abstractmethod
    async def request_group(self, slots: int) -> None:
        """This group's level, in slots."""

    @abstractmethod
    async def release_group(self, name: str, *, force: bool = False) -> None:
        """Delete an instance of this group (never a busy one unless ``force`` or the operator's setting)."""

    @abstractmethod
    async def close_group(self) -> None:
        """Stop this group's background work and close its connections."""

    def pool_groups(self) -> tuple[PooledGroups, ...]:
        return (self,) if self.on_demand is None else (self, self.on_demand)

    async def list_pools(self) -> Mapping[str, PoolKind]:
        """Both groups listed at once (each then does what its plan says); one that cannot list fails both."""
        listed = await asyncio.gather(*(group.list_group() for group in self.pool_groups()), return_exceptions=True)
        pools: dict[str, PoolKind] = {}
        for kind, names in zip((PoolKind.SPOT, PoolKind.ON_DEMAND), listed, strict=False):
            if isinstance(names, BaseException):
                raise names
            pools.update(dict.fromkeys(names, kind))
        self._pools = pools
        return pools

    async def list_instances(self) -> frozenset[str]:
        return frozenset(await self.list_pools())

    async def request_capacity(self, slots: int, pool: PoolKind = PoolKind.SPOT) -> None:
        """``pool``'s level: spot is this group's; on-demand the on-demand group's (refused where there is none)."""
        if pool is PoolKind.SPOT:
            await self.request_group(slots)
        elif self.on_demand is not None:
            await self.on_demand.request_group(slots)
        else:
            refuse_pool(pool, slots, f"set {self.on_demand_setting}")

    async def release(self, name: str, *, force: bool = False) -> None:
        """From the group whose last list had ``name`` (this one when no list had it)."""
        group = self.on_demand if self._pools.get(name) is PoolKind.ON_DEMAND else None
        await (group or self).release_group(name, force=force)

    async def close(self) -> None:
        for group in self.pool_groups():
            await group.close_group()
