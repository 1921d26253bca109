"""Which provider the controller uses (``provider: static | local | azure``) and how often to poll it.

The factory sees only settings and the provider port (events in, busy nodes out), never the runner or
the daemon: the runner is built afterwards with the provider this returns. The Azure SDK is only
imported when the Azure provider is chosen.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from controller.app.settings import ControllerSettings
from controller.providers.base import Clock, Provider, ProviderPort, StaticProvider
from morphing.errors import UserInputError


class ProviderWiring(NamedTuple):
    provider: Provider
    poll_seconds: float  # 0: never polled


def make_provider(
    settings: ControllerSettings, port: ProviderPort, clock: Clock, controller_address: str
) -> ProviderWiring:
    """The provider, built on ``port``; ``controller_address`` is where agents it starts connect."""
    if settings.provider == "static":
        return ProviderWiring(StaticProvider(), 0.0)
    if settings.provider == "local":
        from controller.providers.local import LocalProcessProvider

        local = settings.local
        state = settings.state_dir
        token = settings.agent_token_file or state / "agent.token"
        provider = LocalProcessProvider(
            Path(state).resolve().parent,
            controller_address,
            token,
            local.slots,
            local.imds_url,
            max_nodes=local.max_nodes,
            port=port,
        )
        return ProviderWiring(provider, local.poll_seconds)
    if settings.azure is None:
        raise UserInputError("provider: azure needs an `azure:` section (see docs/azure.md)")
    from controller.providers.azure import AzureScaleSetProvider

    return ProviderWiring(AzureScaleSetProvider(settings.azure, clock, port), settings.azure.poll_seconds)
