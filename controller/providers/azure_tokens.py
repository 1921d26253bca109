"""Handing a scale-set VM its own agent token: a managed Run Command that writes it where the agent waits.

The token travels as a protected parameter (Azure keeps it encrypted and never shows it again) and the
Run Command is deleted once it ran, so nothing of it stays on the VM's model.
"""

from __future__ import annotations

import contextlib
from typing import Any

from azure.core.exceptions import AzureError
from azure.mgmt.compute import models

from controller.providers.azure_config import AzureSettings
from controller.providers.azure_scale import Instance

TOKEN_RUN_COMMAND = "spotmorph-agent-token"
# Run as root by the VM agent (Linux managed Run Command: parameters arrive as environment variables; the
# token as a protected one, which Azure keeps encrypted and never shows). Written beside, then renamed:
# the agent never reads half a token. Readable by the agent's group only (the agent runs as spotmorph).
TOKEN_SCRIPT = """set -eu
umask 027
install -d -m 0755 "$SPOTMORPH_ETC"
tmp="$SPOTMORPH_ETC/agent.token.new"
printf '%s\\n' "$SPOTMORPH_AGENT_TOKEN" > "$tmp"
if getent group spotmorph > /dev/null; then chgrp spotmorph "$tmp"; fi
mv -f "$tmp" "$SPOTMORPH_ETC/agent.token"
"""


def run_command(instance: Instance, token: str) -> models.VirtualMachineRunCommand:
    return models.VirtualMachineRunCommand(
        location=instance.location,
        properties=models.VirtualMachineRunCommandProperties(
            source=models.VirtualMachineRunCommandScriptSource(script=TOKEN_SCRIPT),
            parameters=[models.RunCommandInputParameter(name="SPOTMORPH_ETC", value="/etc/spotmorph")],
            protected_parameters=[models.RunCommandInputParameter(name="SPOTMORPH_AGENT_TOKEN", value=token)],
            timeout_in_seconds=120,
            treat_failure_as_deployment_failure=True,
        ),
    )


async def hand_over(client: Any, s: AzureSettings, instance: Instance, token: str) -> None:
    """Run the token's Run Command on ``instance`` and wait for it; an Azure error is raised as it came."""
    command = run_command(instance, token)
    if s.orchestration_mode == "Uniform":
        commands = client.virtual_machine_scale_set_vm_run_commands
        target: tuple[str, ...] = (s.resource_group, s.scale_set, instance.instance_id, TOKEN_RUN_COMMAND)
    else:
        commands = client.virtual_machine_run_commands
        target = (s.resource_group, instance.name, TOKEN_RUN_COMMAND)
    try:
        await (await commands.begin_create_or_update(*target, command)).result()
    finally:  # ran or failed, none of it (the protected token included) stays on the VM's model
        with contextlib.suppress(AzureError):
            await (await commands.begin_delete(*target)).result()
