"""deploy/ for Azure cannot rot unseen: the ARM template against its own structure and its Bicep source,
cloud-init as YAML (raw and rendered), the container file, and `spotmorph azure check`."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.client.azure_template import (
    bicep_summary,
    check_template,
    placeholders,
    render_cloud_init,
    resources_of,
    template_summary,
)
from controller.client.certs import make_cluster_certs
from spotmorph.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TEMPLATE = DEPLOY / "azure" / "main.json"
BICEP = DEPLOY / "azure" / "main.bicep"
CLOUD_INIT = DEPLOY / "cloud-init" / "agent.yaml"


def template() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(TEMPLATE.read_text())
    return loaded


def test_every_file_in_deploy_is_checked_here_or_in_test_systemd_units() -> None:
    files = {p.relative_to(DEPLOY).as_posix() for p in DEPLOY.rglob("*") if p.is_file()}
    assert files == {
        "Containerfile",
        "aws/template.yaml",  # test_aws_deploy.py
        "azure/main.bicep",
        "azure/main.json",
        "cloud-init/agent.yaml",
        "gcp/instance-group.json",  # these five: test_gcp_deploy.py
        "gcp/instance-template.json",
        "gcp/on-demand.jq",
        "gcp/render.jq",
        "gcp/startup.sh",
        "systemd/spotmorph-agent.service",
        "systemd/spotmorph-controller.service",
        "systemd/spotmorph-controller-ha.service",
        "systemd/spotmorph-postgresql.service",
    }


def test_the_arm_template_has_what_spotmorph_needs() -> None:
    assert check_template(template()) == []
    vmss = resources_of(template(), "Microsoft.Compute/virtualMachineScaleSets")[0]
    assert vmss["properties"]["virtualMachineProfile"]["billingProfile"]["maxPrice"] == "[json(parameters('maxPrice'))]"
    role = resources_of(template(), "Microsoft.Authorization/roleAssignments")[0]
    assert "scope" not in role  # the resource group of the deployment, nothing wider


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("virtualMachineProfile", "evictionPolicy"), "Deallocate", "evictionPolicy must be Delete"),
        (("virtualMachineProfile", "priority"), "Regular", "priority must be Spot"),
        (("singlePlacementGroup",), True, "singlePlacementGroup must be false"),
    ],
)
def test_the_check_catches_a_broken_scale_set(path: tuple[str, ...], value: object, expected: str) -> None:
    broken = copy.deepcopy(template())
    target = resources_of(broken, "Microsoft.Compute/virtualMachineScaleSets")[0]["properties"]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert any(expected in p for p in check_template(broken))


def test_the_check_catches_undeclared_references_and_missing_resources() -> None:
    broken = copy.deepcopy(template())
    del broken["parameters"]["sshPublicKey"]
    broken["resources"] = [r for r in broken["resources"] if "shares" not in r["type"]]
    problems = check_template(broken)
    assert "parameters('sshPublicKey') is used but not declared" in problems
    assert "no Microsoft.Storage/storageAccounts/fileServices/shares resource" in problems


def test_bicep_and_arm_json_declare_the_same_template() -> None:
    bicep, arm = bicep_summary(BICEP.read_text()), template_summary(template())
    for key in ("parameters", "types", "api_versions", "outputs"):
        assert bicep[key] == arm[key], key
    settings = bicep["settings"]
    assert settings["priority"] == "'Spot'" and settings["evictionPolicy"] == "'Delete'"
    assert settings["singlePlacementGroup"] == "false" and settings["orchestrationMode"] == "'Flexible'"
    assert settings["enabledProtocols"] == "'NFS'"
    assert "9980e02c-c2be-4d73-94e8-173b1dc7cf3c" in BICEP.read_text()
    assert "identity.properties.principalId" in BICEP.read_text()
    secure = [name for name, p in template()["parameters"].items() if p["type"] == "securestring"]
    assert secure == ["agentCloudInit"] and "@secure()\nparam agentCloudInit" in BICEP.read_text()


def test_cloud_init_parses_and_renders(tmp_path: Path) -> None:
    raw = CLOUD_INIT.read_text()
    assert raw.startswith("#cloud-config\n")
    document = yaml.safe_load(raw)
    assert {"packages", "write_files", "runcmd", "mounts"} <= set(document)
    certs = tmp_path / "certs"
    make_cluster_certs(certs, ["10.40.0.4"], ["agent"])
    (tmp_path / "agent.token").write_text("agent-secret\n")
    out = tmp_path / "rendered.yaml"
    args = [
        "azure", "cloud-init", "--controller", "10.40.0.4:50051", "--token-file", str(tmp_path / "agent.token"),
        "--ca", str(certs / "ca.crt"), "--cert", str(certs / "agent.crt"), "--key", str(certs / "agent.key"),
        "--storage-account", "spotmorphabc", "--slots", "1",
        "--template", str(CLOUD_INIT), "--unit", str(DEPLOY / "systemd" / "spotmorph-agent.service"),
    ]  # fmt: skip
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(args) == 0
    out.write_text(buffer.getvalue())
    rendered = yaml.safe_load(out.read_text())
    files = {f["path"]: f["content"] for f in rendered["write_files"]}
    assert files["/etc/spotmorph/ca.pem"] == (certs / "ca.crt").read_text()
    assert files["/etc/spotmorph/agent-key.pem"] == (certs / "agent.key").read_text()
    assert files["/etc/spotmorph/agent.token"] == "agent-secret"
    assert "SPOTMORPH_CONTROLLER=10.40.0.4:50051" in files["/etc/spotmorph/agent.env.in"]
    unit = files["/etc/systemd/system/spotmorph-agent.service"]
    assert "--name ${SPOTMORPH_NODE_NAME}" in unit and "User=spotmorph" in unit
    assert "--instance-id ${SPOTMORPH_INSTANCE_ID}" in unit and "RestartPreventExitStatus=2" in unit
    assert rendered["mounts"][0][0] == "spotmorphabc.file.core.windows.net:/spotmorphabc/checkpoints"
    assert "@@" not in out.read_text()
    env_line = next(c for c in rendered["runcmd"] if "compute/name" in " ".join(map(str, c)))
    assert "SPOTMORPH_NODE_NAME" in " ".join(env_line)  # the node name is the VM's name (what the provider lists)
    assert "SPOTMORPH_INSTANCE_ID=$name" in " ".join(env_line)  # and the instance the node is bound to


def test_by_default_cloud_init_writes_no_token_and_the_agent_waits_for_its_own(tmp_path: Path) -> None:
    """Issue 21: every VM got the same token from one cloud-init; now the controller hands each its own."""
    args = _cloud_init_args(tmp_path)
    at = args.index("--token-file")
    del args[at : at + 2]
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(args) == 0
    rendered = yaml.safe_load(buffer.getvalue())
    files = {f["path"]: f["content"] for f in rendered["write_files"]}
    assert "/etc/spotmorph/agent.token" not in files and "@@" not in buffer.getvalue()
    unit = files["/etc/systemd/system/spotmorph-agent.service"]
    assert "--token-file /etc/spotmorph/agent.token --wait-for-token 3600" in unit
    chgrp = next(" ".join(map(str, c)) for c in rendered["runcmd"] if "chgrp" in " ".join(map(str, c)))
    assert "if [ -e /etc/spotmorph/agent.token ]" in chgrp  # no token file yet is no failure


def test_render_needs_every_placeholder() -> None:
    assert placeholders("a @@X@@ b @@Y@@") == ["X", "Y"]
    with pytest.raises(KeyError):
        render_cloud_init("@@X@@", {})


def test_the_container_file_runs_the_controller_as_a_non_root_user() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert text.startswith("#") and "\nFROM python:3.11" in text
    assert "\nUSER spotmorph\n" in text and '"spotmorph", "controller"' in text
    for folder in ("morphing", "controller", "protos", "spotmorph"):
        assert f"COPY {folder} {folder}" in text


def test_azure_check_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text(
        "provider: azure\nazure:\n  subscription_id: 00000000-0000-4000-8000-000000000001\n"
        "  resource_group: spotmorph-rg\n  scale_set: spotmorph-spot\n  target_capacity: 8\n"
        "  managed_identity_client_id: 00000000-0000-4000-8000-0000000000aa\n"
    )
    assert main(["azure", "check", str(config), "--template", str(TEMPLATE)]) == 0
    assert "ok: scale set spotmorph-spot" in capsys.readouterr().out
    config.write_text("provider: static\nazure:\n  subscription_id: mine\n  resource_group: rg\n  scale_set: s\n")
    assert main(["azure", "check", str(config), "--template", str(TEMPLATE)]) == 2
    err = capsys.readouterr().err
    assert "set `provider: azure`" in err and "azure.subscription_id" in err and "azure.target_capacity" in err
    broken = tmp_path / "main.json"
    broken.write_text(TEMPLATE.read_text().replace('"Delete"', '"Deallocate"'))
    config.write_text(
        config.read_text().replace("static", "azure").replace("mine", "00000000-0000-4000-8000-000000000001")
    )
    config.write_text(config.read_text() + "  target_capacity: 2\n")
    assert main(["azure", "check", str(config), "--template", str(broken)]) == 2
    assert "evictionPolicy must be Delete" in capsys.readouterr().err
    assert main(["azure", "check", str(tmp_path / "missing.yaml")]) == 2


def test_the_workers_boot_an_image_with_the_nvidia_driver_in_both_templates() -> None:
    arm = template()
    vmss = resources_of(arm, "Microsoft.Compute/virtualMachineScaleSets")[0]
    storage = vmss["properties"]["virtualMachineProfile"]["storageProfile"]
    assert storage["imageReference"] == "[variables('workerImage')]"
    hpc = {"publisher": "microsoft-dsvm", "offer": "ubuntu-hpc", "sku": "2204", "version": "latest"}
    assert arm["variables"]["workerImage"] == hpc and storage["osDisk"]["diskSizeGB"] == 128
    controller = resources_of(arm, "Microsoft.Compute/virtualMachines")[0]
    assert controller["properties"]["storageProfile"]["imageReference"] == "[variables('ubuntu')]"  # no GPU there
    bicep = BICEP.read_text()
    declared = bicep[bicep.index("var workerImage = {") :].split("}", 1)[0]
    assert all(f"{key}: '{value}'" in declared for key, value in hpc.items())
    scale_set = bicep[bicep.index("resource vmss ") :]
    assert "imageReference: workerImage" in scale_set and "diskSizeGB: 128" in scale_set


def test_the_check_catches_workers_without_a_gpu_driver() -> None:
    broken = copy.deepcopy(template())
    profile = resources_of(broken, "Microsoft.Compute/virtualMachineScaleSets")[0]["properties"]
    profile["virtualMachineProfile"]["storageProfile"]["imageReference"] = "[variables('ubuntu')]"
    assert any("NVIDIA driver" in p for p in check_template(broken))
    profile["virtualMachineProfile"]["extensionProfile"] = {
        "extensions": [
            {"name": "gpu", "properties": {"publisher": "Microsoft.HpcCompute", "type": "NvidiaGpuDriverLinux"}}
        ]
    }
    assert check_template(broken) == []


def _cloud_init_args(tmp_path: Path, *extra: str) -> list[str]:
    certs = tmp_path / "certs"
    make_cluster_certs(certs, ["10.40.0.4"], ["agent"])
    (tmp_path / "agent.token").write_text("agent-secret\n")
    return [
        "azure", "cloud-init", "--controller", "10.40.0.4:50051", "--token-file", str(tmp_path / "agent.token"),
        "--ca", str(certs / "ca.crt"), "--cert", str(certs / "agent.crt"), "--key", str(certs / "agent.key"),
        "--storage-account", "spotmorphabc", "--template", str(CLOUD_INIT),
        "--unit", str(DEPLOY / "systemd" / "spotmorph-agent.service"), *extra,
    ]  # fmt: skip


def _render(tmp_path: Path, *extra: str) -> dict[str, Any]:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert main(_cloud_init_args(tmp_path, *extra)) == 0
    rendered: dict[str, Any] = yaml.safe_load(buffer.getvalue())
    return rendered


def test_cloud_init_installs_the_cuda_build_of_torch_then_spotmorph_with_its_gpu_extra(tmp_path: Path) -> None:
    rendered = _render(tmp_path)
    install = next(" ".join(map(str, c)) for c in rendered["runcmd"] if "pip install" in " ".join(map(str, c)))
    torch_at, spotmorph_at = install.index("pip install -q torch --index-url"), install.index("'spotmorph[gpu]'")
    assert torch_at < spotmorph_at and "https://download.pytorch.org/whl/cu126" in install
    files = {f["path"]: f["content"] for f in rendered["write_files"]}
    assert "SPOTMORPH_SLOTS=auto" in files["/etc/spotmorph/agent.env.in"]  # one slot per GPU found
    unit = files["/etc/systemd/system/spotmorph-agent.service"]
    assert "Environment=NCCL_SOCKET_IFNAME=eth0" in unit
    custom = _render(tmp_path / "b", "--slots", "4", "--torch-index", "https://example.invalid/cu128")
    text = json.dumps(custom)
    assert "SPOTMORPH_SLOTS=4" in text and "https://example.invalid/cu128" in text


def test_cloud_init_refuses_a_slot_count_that_is_not_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_cloud_init_args(tmp_path, "--slots", "0")) == 2
    assert "--slots '0'" in capsys.readouterr().err


def test_azure_md_says_what_the_gpu_workers_get() -> None:
    text = (ROOT / "docs" / "azure.md").read_text()
    for needed in (
        "ubuntu-hpc",
        "NCCL_SOCKET_IFNAME",
        "NCCL_IB_DISABLE",
        "GLOO_SOCKET_IFNAME",
        "spotmorph[gpu]",
        "cu126",
    ):
        assert needed in text, needed
