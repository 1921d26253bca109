"""Which provider the controller uses (``provider: static | local | azure``), wired to the runner.

Providers report what they do and what goes wrong as events in the controller's event log (``spotmorph
events``), and ask the runner whether a node runs a job before deleting its VM. The Azure SDK is only
imported when the Azure provider is chosen.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controller.core.events import EventKind
from controller.core.lifecycle import NodeState
from controller.core.model import RecordEvent
from controller.providers.base import Provider, StaticProvider
from morphing.errors import UserInputError

if TYPE_CHECKING:
    from controller.app.daemon import ControllerSettings
    from controller.shell.runner import Runner

LOCAL_POLL_SECONDS = 2.0


def make_provider(settings: ControllerSettings, runner: Runner, controller_address: str) -> tuple[Provider, float]:
    """The provider and how often to poll it (0: never)."""
    if settings.provider == "static":
        return StaticProvider(), 0.0
    if settings.provider == "local":
        from controller.providers.local import LocalProcessProvider

        state = settings.state_dir
        token = settings.agent_token_file or state / "agent.token"
        return LocalProcessProvider(Path(state).resolve().parent, controller_address, token), LOCAL_POLL_SECONDS
    if settings.azure is None:
        raise UserInputError("provider: azure needs an `azure:` section (see docs/azure.md)")
    from controller.providers.azure import AzureScaleSetProvider

    def emit(kind: EventKind, data: dict[str, Any]) -> None:
        runner.commit([RecordEvent(kind, runner.clock.now(), None, None, data)])

    def busy(name: str) -> bool:
        node = runner.nodes.get(name)
        return node is not None and node.job is not None and node.state in {NodeState.ASSIGNED, NodeState.DRAINING}

    provider = AzureScaleSetProvider(settings.azure, runner.clock, emit=emit, busy=busy)
    return provider, settings.azure.poll_seconds


async def close_provider(provider: Provider) -> None:
    close = getattr(provider, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()
