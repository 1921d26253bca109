"""Which provider the controller uses (``provider: static | local | azure | aws | gcp``) and how often to poll it.

The factory sees only settings and the provider port (events in, busy nodes out), never the runner or
the daemon: the runner is built afterwards with the provider this returns. A cloud's SDK (Azure's, boto3)
is only imported when its provider is chosen. ``local`` (agents as processes on this machine) lives with
the local cluster in the composition root, which the controller never imports: whoever starts the
controller passes its factory in ``extra`` (``spotmorph controller`` does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

from controller.app.settings import ControllerSettings
from controller.providers.base import Clock, Provider, ProviderPort, StaticProvider
from morphing.errors import UserInputError


class ProviderWiring(NamedTuple):
    provider: Provider
    poll_seconds: float  # 0: never polled


# (settings, port, clock, controller address) -> the provider and how often to poll it
ProviderFactory = Callable[[ControllerSettings, ProviderPort, Clock, str], ProviderWiring]


def make_provider(
    settings: ControllerSettings,
    port: ProviderPort,
    clock: Clock,
    controller_address: str,
    extra: Mapping[str, ProviderFactory] | None = None,
) -> ProviderWiring:
    """The provider, built on ``port``; ``controller_address`` is where agents it starts connect.

    ``extra`` names factories of providers the controller does not hold itself (``local``)."""
    factory = (extra or {}).get(settings.provider)
    if factory is not None:
        return factory(settings, port, clock, controller_address)
    if settings.provider == "static":
        return ProviderWiring(StaticProvider(), 0.0)
    if settings.provider == "local":
        raise UserInputError(
            "provider: local starts agents as processes of the local cluster, which only the `spotmorph` "
            "command provides: run the controller as `spotmorph controller` (or pass a factory for 'local' "
            "to make_provider's `extra`)"
        )
    if settings.provider == "aws":
        return _aws(settings, port, clock)
    if settings.provider == "gcp":
        return _gcp(settings, port, clock)
    if settings.azure is None:
        raise UserInputError("provider: azure needs an `azure:` section (see docs/azure.md)")
    from controller.providers.azure import AzureScaleSetProvider
    from controller.tokens import Tokens, token_secret

    vm_token = Tokens({}, token_secret(settings.state_dir)).vm_token  # each VM's own, handed over by Run Command
    provider = AzureScaleSetProvider(settings.azure, clock, port, vm_token=vm_token)
    return ProviderWiring(provider, settings.azure.poll_seconds)


def _aws(settings: ControllerSettings, port: ProviderPort, clock: Clock) -> ProviderWiring:
    if settings.aws is None:
        raise UserInputError("provider: aws needs an `aws:` section (see docs/aws.md)")
    from controller.providers.aws import AwsAutoScalingProvider
    from controller.tokens import Tokens, token_secret

    vm_token = Tokens({}, token_secret(settings.state_dir)).vm_token  # each instance's own, sealed over SSM
    provider = AwsAutoScalingProvider(settings.aws, clock, port, vm_token=vm_token)
    return ProviderWiring(provider, settings.aws.poll_seconds)


def _gcp(settings: ControllerSettings, port: ProviderPort, clock: Clock) -> ProviderWiring:
    """The instance group's provider; its VMs get their tokens through the Identity service, not from it."""
    if settings.gcp is None:
        raise UserInputError("provider: gcp needs a `gcp:` section (see docs/gcp.md)")
    from controller.providers.gcp import GcpInstanceGroupProvider

    return ProviderWiring(GcpInstanceGroupProvider(settings.gcp, clock, port), settings.gcp.poll_seconds)
