"""``spotmorph azure``: offline help for an Azure cluster (docs/azure.md).

``check CONFIG [--template deploy/azure/main.json]`` validates the controller's config (provider: azure
and its ``azure:`` section) and the ARM template, without reaching Azure. ``cloud-init`` renders
deploy/cloud-init/agent.yaml for the scale set's VMs. No Azure SDK is imported here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from controller.files import CONFIG_LIMIT, read_small_text
from morphing.errors import UserInputError

DEFAULT_TEMPLATE = Path("deploy/azure/main.json")
DEFAULT_PACKAGE = "spotmorph[gpu]"  # the gpu extra: NVML for the agent's GPU discovery
TORCH_INDEX = "https://download.pytorch.org/whl/cu126"  # torch built with CUDA 12.6 (drivers >= 525)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="azure_command", metavar="SUBCOMMAND", required=True)
    check = sub.add_parser("check", help="validate a controller config and the ARM template, offline")
    check.add_argument("config", type=Path, help="the controller's YAML config (provider: azure, azure: ...)")
    check.add_argument("--template", type=Path, default=DEFAULT_TEMPLATE, help=f"default {DEFAULT_TEMPLATE}")
    init = sub.add_parser(
        "cloud-init", help="render the scale-set VMs' cloud-init (print it; base64 it for the template)"
    )
    init.add_argument("--controller", required=True, metavar="HOST:PORT", help="the controller's private address")
    init.add_argument(
        "--token-file",
        type=Path,
        help="a token every VM shares (shared_agent_token: true, weaker); default: none, the controller "
        "hands each VM its own by Run Command (azure.agent_tokens)",
    )
    init.add_argument("--ca", type=Path, required=True, help="cluster CA certificate (spotmorph certs)")
    init.add_argument("--cert", type=Path, required=True, help="agent client certificate")
    init.add_argument("--key", type=Path, required=True, help="agent client key")
    init.add_argument("--storage-account", required=True, help="the storage account with the checkpoints share")
    init.add_argument(
        "--slots", default="auto", help="trainer slots per VM (default auto: one per GPU the agent finds)"
    )
    init.add_argument(
        "--package",
        default=DEFAULT_PACKAGE,
        help=f"pip requirement to install (default: {DEFAULT_PACKAGE}; a wheel: 'spotmorph[gpu] @ URL')",
    )
    init.add_argument(
        "--torch-index", default=TORCH_INDEX, help=f"pip index of the torch build to install (default {TORCH_INDEX})"
    )
    init.add_argument(
        "--template",
        type=Path,
        default=Path("deploy/cloud-init/agent.yaml"),
        help="cloud-init template (default %(default)s)",
    )
    init.add_argument(
        "--unit",
        type=Path,
        default=Path("deploy/systemd/spotmorph-agent.service"),
        help="systemd unit the VM runs the agent with (default %(default)s)",
    )


def run(args: argparse.Namespace) -> int:
    if args.azure_command == "check":
        return check(args.config, args.template)
    return cloud_init(args)


def _read(path: Path, what: str) -> str:
    return read_small_text(path, what, CONFIG_LIMIT)


def check(config: Path, template_path: Path) -> int:
    import yaml
    from pydantic import ValidationError

    from controller.client.azure_template import check_template, resources_of
    from controller.providers.azure_config import AzureSettings

    problems: list[str] = []
    try:
        data = yaml.safe_load(_read(config, "config")) or {}
    except yaml.YAMLError as exc:
        raise UserInputError(f"config {config}: not YAML ({exc})") from None
    if not isinstance(data, dict):
        raise UserInputError(f"config {config}: expected a mapping of settings")
    settings: AzureSettings | None = None
    if data.get("provider") != "azure":
        problems.append(f"{config}: provider: {data.get('provider', 'static')!r}; set `provider: azure`")
    try:
        settings = AzureSettings.model_validate(data.get("azure"))
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(p) for p in error["loc"]) or "azure"
            problems.append(f"{config}: azure.{where}: {error['msg']}")
    try:
        template = json.loads(_read(template_path, "--template"))
    except json.JSONDecodeError as exc:
        raise UserInputError(f"--template {template_path}: not JSON ({exc})") from None
    problems += [f"{template_path}: {p}" for p in check_template(template)]
    if settings is not None and isinstance(template, dict):
        for vmss in resources_of(template, "Microsoft.Compute/virtualMachineScaleSets"):
            mode = vmss.get("properties", {}).get("orchestrationMode")
            if mode and mode != settings.orchestration_mode:
                problems.append(f"{config}: azure.orchestration_mode {settings.orchestration_mode} != template {mode}")
        if not settings.managed_identity_client_id:
            print("note: no managed_identity_client_id; DefaultAzureCredential will look for one", file=sys.stderr)
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 2
    assert settings is not None
    print(
        f"ok: scale set {settings.scale_set} in {settings.resource_group} "
        f"({settings.orchestration_mode}, target {settings.target_capacity}); template {template_path} ok"
    )
    return 0


def cloud_init(args: argparse.Namespace) -> int:
    import yaml

    from controller.client.azure_template import render_cloud_init

    unit = _read(args.unit, "--unit")
    if args.slots != "auto" and not (args.slots.isdigit() and int(args.slots) >= 1):
        raise UserInputError(f"--slots {args.slots!r}: give a number >= 1 or 'auto'")
    values = {
        "CONTROLLER_ADDRESS": args.controller,
        "SHARED_TOKEN_FILE": _shared_token_file(args.token_file),
        "CA_PEM": _read(args.ca, "--ca"),
        "AGENT_CERT_PEM": _read(args.cert, "--cert"),
        "AGENT_KEY_PEM": _read(args.key, "--key"),
        "STORAGE_ACCOUNT": args.storage_account,
        "SLOTS": args.slots,
        "SPOTMORPH_PACKAGE": args.package,
        "TORCH_INDEX": args.torch_index,
        "AGENT_UNIT": unit,
    }
    try:
        text = render_cloud_init(_read(args.template, "--template"), values)
    except KeyError as exc:
        raise UserInputError(f"--template {args.template}: no value for {exc}") from None
    yaml.safe_load(text)  # a rendering that is not YAML is a bug here, not the user's
    sys.stdout.write(text)
    return 0


def _shared_token_file(path: Path | None) -> str:
    """The write_files entry of a shared agent token, or nothing (each VM gets its own from the controller)."""
    if path is None:
        return ""
    token = _read(path, "--token-file").strip()
    if not token or any(c in token for c in '"\\\n'):
        raise UserInputError(f"--token-file {path}: one line of token (no quotes or backslashes) expected")
    return f'- path: /etc/spotmorph/agent.token\n  permissions: "0640"\n  content: "{token}"\n'
