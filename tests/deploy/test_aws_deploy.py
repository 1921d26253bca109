"""deploy/aws cannot rot unseen: the CloudFormation template through cfn-lint (offline), what spotmorph needs of the
group, a controller role that allows every call the provider makes, and the instances' user data as scripts."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cfnlint.api import lint  # type: ignore[import-untyped]
from cfnlint.decode import decode_str  # type: ignore[import-untyped]

from controller.app.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "aws" / "template.yaml"
AGENT_UNIT = ROOT / "deploy" / "systemd" / "spotmorph-agent.service"
SAMPLE = {  # parameter values for rendering the user data
    "ControllerPrivateIp": "10.0.1.10",
    "ControllerPort": "50051",
    "Slots": "auto",
    "SlotsPerInstance": "1",
    "MaxSize": "8",
    "TlsParameterPath": "/spotmorph",
    "CheckpointNfs": "fs-0123.efs.us-east-1.amazonaws.com:/",
    "TorchIndex": "https://download.pytorch.org/whl/cu126",
    "SpotmorphPackage": "spotmorph[gpu]",
    "SpotGroup": "stack-SpotGroup-ABC",
    "OnDemandGroup": "stack-OnDemandGroup-DEF",
    "OnDemandMaxSize": "2",
    "AWS::Region": "us-east-1",
    "AWS::StackName": "stack",
}


def template() -> dict[str, Any]:
    decoded, problems = decode_str(TEMPLATE.read_text())
    assert not problems, problems
    found: dict[str, Any] = decoded
    return found


def resources(kind: str) -> list[dict[str, Any]]:
    return [r["Properties"] for r in template()["Resources"].values() if r["Type"] == kind]


def user_data(kind: str) -> str:
    """The instance's user data script as CloudFormation renders it (``${X}`` substituted, ``${!X}`` kept)."""
    properties = resources(kind)[0]
    data = properties.get("LaunchTemplateData", properties)["UserData"]
    text: str = data["Fn::Base64"]["Fn::Sub"]
    used = set(re.findall(r"\$\{([A-Za-z0-9:]+)\}", text))
    assert used <= set(SAMPLE), used - set(SAMPLE)
    for name, value in SAMPLE.items():
        text = text.replace("${" + name + "}", value)
    return text.replace("${!", "${")


def test_cfn_lint_finds_nothing() -> None:
    matches = lint(TEMPLATE.read_text(), regions=["us-east-1"])
    assert [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in matches] == []


def test_the_group_is_spot_only_over_several_types_rebalanced_and_leaves_scale_in_to_the_controller() -> None:
    (group,) = [g for g in resources("AWS::AutoScaling::AutoScalingGroup") if "MixedInstancesPolicy" in g]
    policy = group["MixedInstancesPolicy"]
    distribution = policy["InstancesDistribution"]
    assert distribution["OnDemandBaseCapacity"] == 0 and distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    assert distribution["SpotAllocationStrategy"] == {"Ref": "SpotAllocationStrategy"}
    strategies = template()["Parameters"]["SpotAllocationStrategy"]["AllowedValues"]
    assert set(strategies) == {"price-capacity-optimized", "capacity-optimized"}
    assert len(policy["LaunchTemplate"]["Overrides"]) >= 3
    assert group["CapacityRebalance"] is True and group["NewInstancesProtectedFromScaleIn"] is True
    assert "DesiredCapacity" not in group, "the controller owns it: a stack update must not reset it"
    (launch,) = resources("AWS::EC2::LaunchTemplate")
    assert launch["LaunchTemplateData"]["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 for the notices


def _policy_actions(role: dict[str, Any]) -> set[str]:
    actions: set[str] = set()
    for policy in role.get("Policies", []):
        for statement in policy["PolicyDocument"]["Statement"]:
            found = statement["Action"]
            actions.update([found] if isinstance(found, str) else found)
    return actions


def test_the_controllers_role_allows_every_call_the_provider_makes_and_no_more() -> None:
    source = "".join(p.read_text() for p in (ROOT / "controller" / "providers").glob("aws*.py"))
    calls = set(re.findall(r'call\(\s*"(autoscaling|ssm)",\s*"([a-z_]+)"', source))
    assert len(calls) >= 6
    wanted = {f"{service}:{''.join(w.title() for w in op.split('_'))}" for service, op in calls}
    roles = [r for r in resources("AWS::IAM::Role") if r["Policies"][0]["PolicyName"] == "spotmorph-controller"]
    allowed = _policy_actions(roles[0])
    assert wanted <= allowed, wanted - allowed
    assert allowed - wanted == {"ssm:GetParameter"}  # its certificates


def test_the_workers_user_data_is_a_script_that_starts_the_agent_as_deploy_systemd_does(tmp_path: Path) -> None:
    script = user_data("AWS::EC2::LaunchTemplate")
    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    assert "latest/api/token" in script and "meta-data/instance-id" in script  # IMDSv2
    assert "SPOTMORPH_NODE_NAME=$instance\nSPOTMORPH_INSTANCE_ID=$instance\n" in script  # what the provider lists
    assert "SPOTMORPH_CONTROLLER=10.0.1.10:50051" in script
    unit = script[script.index("<<'UNIT'\n") + 8 : script.index("\nUNIT\n")]
    flags = _flags(unit)
    assert flags == _flags(AGENT_UNIT.read_text()) | {"--cloud aws"}
    analyze = shutil.which("systemd-analyze")
    if analyze is not None:
        command = Path(sys.executable).with_name("spotmorph")
        local = tmp_path / "spotmorph-agent.service"
        local.write_text(unit.replace("/opt/spotmorph/.venv/bin/spotmorph", str(command)))
        result = subprocess.run([analyze, "verify", str(local)], capture_output=True, text=True, timeout=60)
        assert not [line for line in result.stdout.splitlines() if local.name in line], result.stdout


def _flags(unit: str) -> set[str]:
    exec_start = re.search(r"ExecStart=\S+ agent (.*?)\n[A-Z]", unit.replace("\\\n", " "), re.S)
    assert exec_start is not None
    words = exec_start.group(1).split()
    return {f"{w} {words[i + 1]}" for i, w in enumerate(words) if w.startswith("--")}


def test_the_controllers_user_data_writes_a_config_the_controller_takes(tmp_path: Path) -> None:
    script = user_data("AWS::EC2::Instance")
    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
    config = yaml.safe_load(script[script.index("<<YAML\n") + 7 : script.index("\nYAML\n")])
    settings = ControllerSettings(state_dir=tmp_path, **config)
    assert settings.provider == "aws" and settings.aws is not None
    assert settings.aws.auto_scaling_group == "stack-SpotGroup-ABC" and settings.tls_cert is not None
    assert settings.aws.on_demand_auto_scaling_group == "stack-OnDemandGroup-DEF"
    assert settings.aws.on_demand_max_capacity == 2


def test_the_on_demand_group_launches_the_same_workers_on_demand_and_leaves_scale_in_to_the_controller() -> None:
    (group,) = [g for g in resources("AWS::AutoScaling::AutoScalingGroup") if "MixedInstancesPolicy" not in g]
    assert group["LaunchTemplate"]["LaunchTemplateId"] == {"Ref": "WorkerLaunchTemplate"}  # no Spot market option
    assert group["MinSize"] == "0" and group["MaxSize"] == {"Ref": "OnDemandMaxSize"}
    assert group["NewInstancesProtectedFromScaleIn"] is True and "DesiredCapacity" not in group
    assert {"Key": "spotmorph:stack", "Value": {"Ref": "AWS::StackName"}, "PropagateAtLaunch": True} in group["Tags"]


@pytest.mark.parametrize("name", ["SpotAllocationStrategy", "MaxSize", "SlotsPerInstance", "InstanceType1"])
def test_aws_md_explains_the_parameters(name: str) -> None:
    assert name in (ROOT / "docs" / "aws.md").read_text()
