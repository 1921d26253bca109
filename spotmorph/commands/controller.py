"""``spotmorph controller``: the controller daemon, with the local cluster's provider registered.

The daemon is ``controller.app.commands.controller``; the controller does not import the composition
root, so ``provider: local`` (agents as processes on this machine, :mod:`spotmorph.local.provider`)
is injected here as a provider factory.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from controller.app.commands import controller as daemon
from spotmorph.local.layout import ClusterDir
from spotmorph.local.provider import LocalProcessProvider

if TYPE_CHECKING:
    from controller.app.providers import ProviderFactory, ProviderWiring
    from controller.app.settings import ControllerSettings
    from controller.providers.base import Clock, ProviderPort


def add_arguments(parser: argparse.ArgumentParser) -> None:
    daemon.add_arguments(parser)


def local_provider(settings: ControllerSettings, port: ProviderPort, clock: Clock, address: str) -> ProviderWiring:
    """``provider: local``: agents started in ``vms/`` beside the state directory, connecting to ``address``."""
    from controller.app.providers import ProviderWiring

    local = settings.local
    provider = LocalProcessProvider(
        ClusterDir.of_state_dir(settings.state_dir).root,
        address,
        local.slots,
        local.imds_url,
        max_nodes=local.max_nodes,
        port=port,
        state_dir=settings.state_dir,
        max_on_demand_nodes=local.max_on_demand_nodes,
    )
    return ProviderWiring(provider, local.poll_seconds)


PROVIDERS: dict[str, ProviderFactory] = {"local": local_provider}


def run(args: argparse.Namespace) -> int:
    return daemon.run(args, PROVIDERS)
