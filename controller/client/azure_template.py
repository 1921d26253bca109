"""Offline checks of the Azure deployment files: the ARM template, its Bicep source, cloud-init.

Pure functions over text and JSON (no Azure SDK, no network), used by ``spotmorph azure check`` and
by the tests that keep deploy/ from rotting.
"""

from __future__ import annotations

import re
from typing import Any

VM_CONTRIBUTOR = "9980e02c-c2be-4d73-94e8-173b1dc7cf3c"
REQUIRED_TYPES = (
    "Microsoft.Compute/virtualMachineScaleSets",
    "Microsoft.Compute/virtualMachines",
    "Microsoft.ManagedIdentity/userAssignedIdentities",
    "Microsoft.Authorization/roleAssignments",
    "Microsoft.Storage/storageAccounts",
    "Microsoft.Storage/storageAccounts/fileServices/shares",
    "Microsoft.Network/virtualNetworks",
)
GPU_DRIVER_IMAGES = (("microsoft-dsvm", "ubuntu-hpc"),)  # (publisher, offer) of images with the NVIDIA driver
GPU_DRIVER_EXTENSION = "NvidiaGpuDriverLinux"
_REFERENCE = re.compile(r"(parameters|variables)\('([A-Za-z0-9_]+)'\)")
_VARIABLE = re.compile(r"\[variables\('([A-Za-z0-9_]+)'\)\]")
_PLACEHOLDER = re.compile(r"@@([A-Z_]+)@@")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def resources_of(template: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in template.get("resources", []) if isinstance(r, dict) and r.get("type") == kind]


def check_template(template: Any) -> list[str]:
    """Problems with an ARM JSON template (empty: it has what spotmorph needs)."""
    if not isinstance(template, dict):
        return ["the template is not a JSON object"]
    problems = []
    if "deploymentTemplate.json" not in str(template.get("$schema", "")):
        problems.append("$schema: not a resource-group deployment template")
    if not isinstance(template.get("contentVersion"), str):
        problems.append("contentVersion: missing")
    parameters, variables = template.get("parameters", {}), template.get("variables", {})
    resources = template.get("resources")
    if not isinstance(parameters, dict) or not isinstance(variables, dict) or not isinstance(resources, list):
        return [*problems, "parameters/variables must be objects and resources a list"]
    for text in _strings({k: v for k, v in template.items() if k != "parameters"}):
        for kind, name in _REFERENCE.findall(text):
            if name not in (parameters if kind == "parameters" else variables):
                problems.append(f"{kind}('{name}') is used but not declared")
    for index, resource in enumerate(resources):
        missing = [k for k in ("type", "apiVersion", "name") if not isinstance(resource, dict) or k not in resource]
        if missing:
            problems.append(f"resources[{index}]: missing {', '.join(missing)}")
    for kind in REQUIRED_TYPES:
        if not resources_of(template, kind):
            problems.append(f"no {kind} resource")
    for vmss in resources_of(template, "Microsoft.Compute/virtualMachineScaleSets"):
        props = vmss.get("properties", {})
        profile = props.get("virtualMachineProfile", {})
        if profile.get("priority") != "Spot":
            problems.append("scale set: virtualMachineProfile.priority must be Spot")
        if profile.get("evictionPolicy") != "Delete":
            problems.append("scale set: evictionPolicy must be Delete (evicted VMs leave the set)")
        if props.get("singlePlacementGroup") is not False:
            problems.append("scale set: singlePlacementGroup must be false (more than 100 VMs, spot capacity)")
        if "customData" not in profile.get("osProfile", {}):
            problems.append("scale set: osProfile.customData (the agent's cloud-init) is missing")
        if not has_gpu_driver(profile, variables):
            problems.append(
                "scale set: the workers need the NVIDIA driver: boot microsoft-dsvm ubuntu-hpc "
                f"or add the {GPU_DRIVER_EXTENSION} extension"
            )
    for vm in resources_of(template, "Microsoft.Compute/virtualMachines"):
        if "UserAssigned" not in str(vm.get("identity", {}).get("type", "")):
            problems.append("controller VM: needs the user-assigned managed identity")
    for role in resources_of(template, "Microsoft.Authorization/roleAssignments"):
        props = role.get("properties", {})
        if "userAssignedIdentities" not in str(props.get("principalId", "")):
            problems.append("role assignment: principalId must be the controller's managed identity")
        definition = str(props.get("roleDefinitionId", "")) + str(variables.get("vmContributorRoleId", ""))
        if VM_CONTRIBUTOR not in definition:
            problems.append("role assignment: expected Virtual Machine Contributor (the least role that scales)")
        if (
            "scope" in role
            and "resourceGroup" not in str(role["scope"])
            and "virtualMachineScaleSets" not in str(role["scope"])
        ):
            problems.append("role assignment: scope it to the resource group or the scale set, nothing wider")
    for share in resources_of(template, "Microsoft.Storage/storageAccounts/fileServices/shares"):
        if share.get("properties", {}).get("enabledProtocols") not in ("NFS", "SMB"):
            problems.append("file share: enabledProtocols must be NFS (or SMB)")
    return problems


def has_gpu_driver(profile: dict[str, Any], variables: dict[str, Any]) -> bool:
    """Whether a scale set's VMs boot with the NVIDIA driver: an image that carries it, or the driver extension."""
    image = profile.get("storageProfile", {}).get("imageReference")
    if isinstance(image, str) and (match := _VARIABLE.fullmatch(image)):
        image = variables.get(match.group(1))
    if isinstance(image, dict) and (image.get("publisher"), image.get("offer")) in GPU_DRIVER_IMAGES:
        return True
    return GPU_DRIVER_EXTENSION in str(profile.get("extensionProfile", ""))


def bicep_summary(text: str) -> dict[str, Any]:
    """Parameters, resource types and a few key settings declared in a Bicep file (a light parse)."""
    return {
        "parameters": set(re.findall(r"^param\s+(\w+)\s", text, re.MULTILINE)),
        "types": {t for t in re.findall(r"^resource\s+\w+\s+'([^@']+)@", text, re.MULTILINE)},
        "api_versions": set(re.findall(r"^resource\s+\w+\s+'([^']+)'", text, re.MULTILINE)),
        "outputs": set(re.findall(r"^output\s+(\w+)\s", text, re.MULTILINE)),
        "settings": {
            key: value
            for key, value in re.findall(r"^\s*(\w+):\s*('[^']*'|true|false|-?\d+)\s*(?://.*)?$", text, re.MULTILINE)
        },
    }


def template_summary(template: dict[str, Any]) -> dict[str, Any]:
    resources = [r for r in template.get("resources", []) if isinstance(r, dict)]
    return {
        "parameters": set(template.get("parameters", {})),
        "types": {r["type"] for r in resources},
        "api_versions": {f"{r['type']}@{r['apiVersion']}" for r in resources},
        "outputs": set(template.get("outputs", {})),
    }


def render_cloud_init(text: str, values: dict[str, str]) -> str:
    """Fill ``@@NAME@@`` placeholders; a multi-line value is indented to its placeholder's column.

    A line that is only a commented placeholder (``# @@NAME@@``, so the template stays YAML) becomes the
    value's lines at its indentation, or no line at all for an empty value (an optional block)."""
    missing = sorted(set(_PLACEHOLDER.findall(text)) - set(values))
    if missing:
        raise KeyError(", ".join(missing))
    lines: list[str] = []
    for line in text.splitlines():
        match = _PLACEHOLDER.search(line)
        value = values[match.group(1)].strip("\n") if match else ""
        block = match is not None and line.strip() == f"# {match.group(0)}"
        if match and (block or ("\n" in value and line.strip() == match.group(0))):
            indent = line[: len(line) - len(line.lstrip())]
            lines.extend(f"{indent}{part}" if part else "" for part in value.split("\n") if value)
            continue
        lines.append(_PLACEHOLDER.sub(lambda m: values[m.group(1)], line))
    return "\n".join(lines) + "\n"


def placeholders(text: str) -> list[str]:
    return sorted(set(_PLACEHOLDER.findall(text)))
