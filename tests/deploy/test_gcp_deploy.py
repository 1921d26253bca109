"""deploy/gcp cannot rot unseen: its bodies, filled in as docs/gcp.md says (render.jq), go through the real
google-cloud-compute client to the fake Compute Engine server, which refuses what the API would; the group it
makes is one the provider sizes; and the startup script reads only metadata the template sets, trades the
identity token before the agent starts, and starts it with flags the agent takes."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import requests
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

from controller.app.commands import gcp as gcp_command
from tests.gcp.fake_compute import FakeCompute
from tests.gcp.harness import Clock
from tests.providers.contract import Port
from worker_agent.commands import agent as agent_command

ROOT = Path(__file__).resolve().parents[2]
GCP = ROOT / "deploy" / "gcp"
SCRIPT = GCP / "startup.sh"
VALUES = {
    "controller": "10.128.0.2:50051",
    "audience": "spotmorph/spotmorph-test/us-central1-a/spotmorph-spot",
    "ca_pem": "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
    "agent_cert_pem": "-----BEGIN CERTIFICATE-----\nAGENT\n-----END CERTIFICATE-----\n",
    "agent_key_pem": "-----BEGIN PRIVATE KEY-----\nKEY\n-----END PRIVATE KEY-----\n",
    "checkpoints": "10.128.0.9:/checkpoints",
    "worker_service_account": "spotmorph-worker@spotmorph-test.iam.gserviceaccount.com",
    "project": "spotmorph-test",
}


def body(name: str) -> Any:
    return json.loads((GCP / name).read_text())


def render(value: Any, named: dict[str, str]) -> Any:
    """What render.jq does: every @@NAME@@ in a string becomes the named value ``name``; a missing one fails."""
    if isinstance(value, dict):
        return {k: render(v, named) for k, v in value.items()}
    if isinstance(value, list):
        return [render(v, named) for v in value]
    if isinstance(value, str):
        return re.sub(r"@@([A-Z_]+)@@", lambda m: named[m.group(1).lower()], value)
    return value


def rendered(name: str) -> Any:
    return render(body(name), {**VALUES, "startup_script": SCRIPT.read_text()})


def metadata(template: Any) -> dict[str, str]:
    return {item["key"]: item["value"] for item in template["properties"]["metadata"]["items"]}


@pytest.mark.skipif(shutil.which("jq") is None, reason="no jq here (docs/gcp.md fills the bodies with it)")
def test_render_jq_fills_every_placeholder_and_refuses_a_missing_one() -> None:
    arguments = [a for key, value in VALUES.items() for a in ("--arg", key, value)]
    command = ["jq", *arguments, "--rawfile", "startup_script", str(SCRIPT), "-f", str(GCP / "render.jq")]
    for name in ("instance-template.json", "instance-group.json"):
        out = subprocess.run([*command, str(GCP / name)], capture_output=True, text=True, timeout=60, check=True)
        assert json.loads(out.stdout) == rendered(name)
    partial = ["jq", "--arg", "controller", "x", "-f", str(GCP / "render.jq"), str(GCP / "instance-template.json")]
    refused = subprocess.run(partial, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode != 0 and "no --arg or --rawfile" in refused.stderr


def test_the_template_is_what_spotmorph_needs() -> None:
    template = rendered("instance-template.json")
    properties = template["properties"]
    assert properties["scheduling"]["provisioningModel"] == "SPOT"
    assert properties["scheduling"]["instanceTerminationAction"] == "DELETE"  # the group recreates a preempted VM
    assert len(properties["serviceAccounts"]) == 1, "identity tokens need a service account on the VM"
    assert "accessConfigs" not in properties["networkInterfaces"][0], "no public address: Cloud NAT (docs/gcp.md)"
    values = metadata(template)
    assert values["startup-script"] == SCRIPT.read_text() and values["spotmorph-controller"] == VALUES["controller"]
    read = set(re.findall(r"(?:attribute|optional) (spotmorph-[a-z-]+)", SCRIPT.read_text()))
    assert read == {k for k in values if k.startswith("spotmorph-")}, "the script reads exactly the keys set"
    group = rendered("instance-group.json")
    assert group["targetSize"] == 0 and group["instanceTemplate"].endswith(f"/{template['name']}")


def test_the_bodies_go_through_the_client_to_the_fake_and_make_a_group_the_provider_sizes() -> None:
    async def scenario() -> None:
        fake = FakeCompute(op_polls=0)  # DONE at once: the client's own operation polling ignores api_endpoint
        url = await fake.start()
        try:
            await asyncio.to_thread(insert_template_and_group, url, fake.project, fake.zone)
            template = fake.templates["spotmorph-worker"]
            assert metadata(template)["startup-script"] == SCRIPT.read_text()
            assert "spotmorph-spot" in fake.groups and fake.groups["spotmorph-spot"].target_size == 0
            await sized_by_the_provider(fake)
        finally:
            await fake.stop()

    asyncio.run(scenario())


def insert_template_and_group(url: str, project: str, zone: str) -> None:
    anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
    options = ClientOptions(api_endpoint=url)
    templates = compute_v1.InstanceTemplatesClient(credentials=anonymous, transport="rest", client_options=options)
    resource = compute_v1.InstanceTemplate.from_json(json.dumps(rendered("instance-template.json")))
    done = compute_v1.Operation.Status.DONE
    assert templates.insert_unary(project=project, instance_template_resource=resource).status == done
    assert templates.get(project=project, instance_template="spotmorph-worker").properties.scheduling.provisioning_model
    groups = compute_v1.InstanceGroupManagersClient(credentials=anonymous, transport="rest", client_options=options)
    manager = compute_v1.InstanceGroupManager.from_json(json.dumps(rendered("instance-group.json")))
    assert groups.insert_unary(project=project, zone=zone, instance_group_manager_resource=manager).status == done


async def sized_by_the_provider(fake: FakeCompute) -> None:
    from controller.providers.gcp import GcpInstanceGroupProvider
    from controller.providers.gcp_config import GcpSettings

    settings = GcpSettings(
        project=fake.project,
        zone=fake.zone,
        instance_group="spotmorph-spot",
        target_capacity=2,
        api_endpoint=fake.base_url,
        operation_poll_seconds=0,
    )
    provider = GcpInstanceGroupProvider(settings, Clock(), Port())
    try:
        await provider.list_instances()
        while provider.pending:
            await asyncio.gather(*provider.pending.values())
        names = await provider.list_instances()
        assert len(names) == 2 and all(n.startswith("spotmorph-gpu-") for n in names)
    finally:
        await provider.close()


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("scheduling", "automaticRestart"), True, "cannot restart automatically"),
        (("scheduling", "onHostMaintenance"), "MIGRATE", "TERMINATE"),
        (("scheduling", "instanceTerminationAction"), None, "STOP or DELETE"),
        (("scheduling", "preemptibel"), True, "Unknown name"),
        (("serviceAccounts",), [{"email": "a"}, {"email": "b"}], "at most one service account"),
    ],
)
def test_the_fake_refuses_what_the_api_would(path: tuple[str, ...], value: Any, says: str) -> None:
    template = rendered("instance-template.json")
    target = template["properties"]
    for key in path[:-1]:
        target = target[key]
    if value is None:
        del target[path[-1]]
    else:
        target[path[-1]] = value

    async def scenario() -> None:
        fake = FakeCompute()
        url = await fake.start()
        try:  # as JSON, past the client (whose own schema would refuse an unknown field before the API)
            answer = await asyncio.to_thread(
                requests.post, f"{url}/compute/v1/projects/{fake.project}/global/instanceTemplates", json=template
            )
            assert answer.status_code == 400 and says in answer.json()["error"]["message"]
            assert not fake.templates
        finally:
            await fake.stop()

    asyncio.run(scenario())


def test_the_startup_script_is_bash_that_trades_the_token_before_the_agent_starts() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/bash\n") and "set -euo pipefail" in text
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    assert "Metadata-Flavor: Google" in text
    assert text.index("gcp agent-token") < text.index("systemctl restart spotmorph-agent")
    exchange = _command(text, '"$VENV/bin/spotmorph" gcp agent-token')
    args = parser_of(gcp_command).parse_args(exchange[1:])  # after "gcp"
    assert args.gcp_command == "agent-token" and str(args.out) == "/etc/spotmorph/agent.token"
    unit = text.split("<< 'UNIT'\n", 1)[1].split("\nUNIT\n", 1)[0]
    agent = _command(unit, "ExecStart=/opt/spotmorph/.venv/bin/spotmorph agent")[1:]
    args = parser_of(agent_command).parse_args(agent)
    assert args.cloud == "gcp" and args.imds_url == "http://metadata.google.internal"
    assert args.name == args.instance_id == "SPOTMORPH_NODE_NAME"  # the VM's name is both
    assert str(args.token_file) == "/etc/spotmorph/agent.token"


def parser_of(command: ModuleType) -> argparse.ArgumentParser:
    """The parser of one ``spotmorph`` subcommand (cheaper than the whole CLI's, which imports every command)."""
    parser = argparse.ArgumentParser(prog=command.__name__)
    command.add_arguments(parser)
    return parser


def _command(text: str, start: str) -> list[str]:
    """The command line beginning with ``start`` (continued lines joined) split as a shell would, without the
    program itself: the script's constants (ETC=..., VENV=...) filled in, other variables left as their names."""
    constants: dict[str, str] = dict(re.findall(r"^([A-Z]+)=(/[^\s]+)$", SCRIPT.read_text(), re.MULTILINE))
    joined = []
    for line in text[text.index(start) :].splitlines():
        joined.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break

    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        return constants.get(name, name)

    return shlex.split(re.sub(r"\$\{?([A-Za-z_]+)\}?", value, " ".join(joined)))[1:]


def on_demand(name: str, group: str = "spotmorph-on-demand") -> Any:
    """The on-demand pool's body: the rendered Spot one through deploy/gcp/on-demand.jq, as docs/gcp.md says."""
    command = ["jq", "--arg", "group", group, "-f", str(GCP / "on-demand.jq")]
    out = subprocess.run(command, input=json.dumps(rendered(name)), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(shutil.which("jq") is None, reason="no jq here (docs/gcp.md makes the on-demand bodies with it)")
def test_the_on_demand_bodies_are_the_spot_ones_without_spot_and_the_provider_sizes_both_groups() -> None:
    template, group = on_demand("instance-template.json"), on_demand("instance-group.json")
    spot = rendered("instance-template.json")
    assert template["properties"]["scheduling"]["provisioningModel"] == "STANDARD"
    assert metadata(template)["spotmorph-audience"] == "spotmorph/spotmorph-test/us-central1-a/spotmorph-on-demand"
    same = {k: v for k, v in metadata(spot).items() if k != "spotmorph-audience"}
    assert {k: v for k, v in metadata(template).items() if k != "spotmorph-audience"} == same
    assert group["name"] == "spotmorph-on-demand" and group["instanceTemplate"].endswith(f"/{template['name']}")

    async def scenario() -> None:
        from controller.providers.gcp import GcpInstanceGroupProvider
        from controller.providers.gcp_config import GcpSettings
        from scheduler.pools import PoolKind

        fake = FakeCompute(op_polls=0)
        url = await fake.start()
        try:
            await asyncio.to_thread(insert_template_and_group, url, fake.project, fake.zone)
            await asyncio.to_thread(insert_bodies, url, fake.project, fake.zone, template, group)
            settings = GcpSettings(
                project=fake.project,
                zone=fake.zone,
                instance_group="spotmorph-spot",
                on_demand_instance_group="spotmorph-on-demand",
                on_demand_max_capacity=2,
                target_capacity=1,
                api_endpoint=fake.base_url,
                operation_poll_seconds=0,
            )
            provider = GcpInstanceGroupProvider(settings, Clock(), Port())
            try:
                await provider.request_capacity(2, PoolKind.ON_DEMAND)
                for _ in range(3):
                    await provider.list_pools()
                    while provider.pending:
                        await asyncio.gather(*provider.pending.values())
                pools = await provider.list_pools()
                assert sorted(pools.values()) == sorted([PoolKind.SPOT, PoolKind.ON_DEMAND, PoolKind.ON_DEMAND])
                assert all(n.startswith("spotmorph-gpu-od-") for n, p in pools.items() if p is PoolKind.ON_DEMAND)
            finally:
                await provider.close()
        finally:
            await fake.stop()

    asyncio.run(scenario())


def insert_bodies(url: str, project: str, zone: str, template: Any, group: Any) -> None:
    anonymous = AnonymousCredentials()  # type: ignore[no-untyped-call]
    options = ClientOptions(api_endpoint=url)
    templates = compute_v1.InstanceTemplatesClient(credentials=anonymous, transport="rest", client_options=options)
    resource = compute_v1.InstanceTemplate.from_json(json.dumps(template))
    templates.insert_unary(project=project, instance_template_resource=resource)
    groups = compute_v1.InstanceGroupManagersClient(credentials=anonymous, transport="rest", client_options=options)
    manager = compute_v1.InstanceGroupManager.from_json(json.dumps(group))
    groups.insert_unary(project=project, zone=zone, instance_group_manager_resource=manager)
