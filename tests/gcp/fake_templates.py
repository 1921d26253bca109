"""What Compute Engine refuses in an instance template or a managed instance group body, as the fake checks it.

The rules the API documents for what deploy/gcp ships: unknown fields are errors (the API answers "Invalid
JSON payload received. Unknown name"), a Spot VM cannot restart automatically or live-migrate, a VM with
GPUs cannot live-migrate, one boot disk made from an image, metadata keys unique and within their limits,
one service account; a group names a template that exists and a base name short enough for its suffix.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
METADATA_KEY = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
LABEL = re.compile(r"^[a-z][-_a-z0-9]{0,62}$")
GPU_FAMILIES = ("a2-", "a3-", "a4-", "g2-", "g4-")  # machine types with GPUs attached
METADATA_VALUE_LIMIT = 256 << 10
METADATA_TOTAL_LIMIT = 512 << 10

TEMPLATE_FIELDS = {"name", "description", "properties"}
PROPERTIES = {
    "machineType",
    "description",
    "disks",
    "networkInterfaces",
    "metadata",
    "scheduling",
    "serviceAccounts",
    "guestAccelerators",
    "labels",
    "tags",
    "shieldedInstanceConfig",
}
SCHEDULING = {"provisioningModel", "instanceTerminationAction", "onHostMaintenance", "automaticRestart", "preemptible"}
DISK = {"boot", "autoDelete", "type", "mode", "deviceName", "initializeParams"}
INIT = {"sourceImage", "diskSizeGb", "diskType", "labels"}
NIC = {"network", "subnetwork", "accessConfigs", "nicType", "stackType"}
ACCESS = {"name", "type", "networkTier"}
ACCOUNT = {"email", "scopes"}
GROUP_FIELDS = {
    "name",
    "description",
    "baseInstanceName",
    "instanceTemplate",
    "targetSize",
    "zone",
    "instanceLifecyclePolicy",
    "updatePolicy",
    "namedPorts",
}
LIFECYCLE = {"defaultActionOnFailure", "forceUpdateOnRepair"}


class Problems:
    """Collected like the API's 400: each names the field as ``resource.properties...``."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.found.append(f"Invalid value for field 'resource.{where}': {message}")

    def fields(self, value: Any, allowed: set[str], where: str) -> dict[str, Any]:
        """``value`` as an object whose keys are all ``allowed``; {} (and a problem) otherwise."""
        if not isinstance(value, dict):
            self.add(where, "must be an object")
            return {}
        for key in sorted(set(value) - allowed):
            self.found.append(f"Invalid JSON payload received. Unknown name \"{key}\" at 'resource.{where}'")
        return value


def template_problems(body: Any) -> list[str]:
    p = Problems()
    template = p.fields(body, TEMPLATE_FIELDS, "")
    if not NAME.match(str(template.get("name", ""))):
        p.add("name", "must be a lowercase RFC 1035 name of at most 63 characters")
    props = p.fields(template.get("properties"), PROPERTIES, "properties")
    machine = str(props.get("machineType", ""))
    if not re.fullmatch(r"[a-z][-a-z0-9]*", machine):
        p.add("properties.machineType", "a machine type name (not a URL) is required in a template")
    sched = p.fields(props.get("scheduling", {}), SCHEDULING, "properties.scheduling")
    gpus = bool(props.get("guestAccelerators")) or machine.startswith(GPU_FAMILIES)
    if sched.get("provisioningModel", "STANDARD") not in ("STANDARD", "SPOT"):
        p.add("properties.scheduling.provisioningModel", "must be STANDARD or SPOT")
    if sched.get("provisioningModel") == "SPOT" or sched.get("preemptible"):
        if sched.get("automaticRestart", True) is not False:
            p.add("properties.scheduling.automaticRestart", "Spot VMs cannot restart automatically (false)")
        if sched.get("instanceTerminationAction") not in ("STOP", "DELETE"):
            p.add("properties.scheduling.instanceTerminationAction", "Spot VMs need STOP or DELETE")
    if (gpus or sched.get("provisioningModel") == "SPOT") and sched.get("onHostMaintenance") != "TERMINATE":
        p.add("properties.scheduling.onHostMaintenance", "VMs with GPUs and Spot VMs cannot migrate: TERMINATE")
    _disks(p, props.get("disks"))
    _interfaces(p, props.get("networkInterfaces"))
    _metadata(p, props.get("metadata", {}))
    accounts = props.get("serviceAccounts", [])
    if not isinstance(accounts, list) or len(accounts) > 1:
        p.add("properties.serviceAccounts", "at most one service account")
    for account in accounts if isinstance(accounts, list) else ():
        fields = p.fields(account, ACCOUNT, "properties.serviceAccounts[0]")
        if not isinstance(fields.get("email"), str) or not isinstance(fields.get("scopes"), list):
            p.add("properties.serviceAccounts[0]", "needs an email and a list of scopes")
    labels = props.get("labels", {})
    if not isinstance(labels, dict) or not all(LABEL.match(str(k)) for k in labels):
        p.add("properties.labels", "keys: lowercase letters, digits, '-' and '_', starting with a letter")
    return p.found


def _disks(p: Problems, disks: Any) -> None:
    if not isinstance(disks, list) or not disks:
        p.add("properties.disks", "at least one disk")
        return
    boots = [d for d in disks if isinstance(d, dict) and d.get("boot")]
    if len(boots) != 1:
        p.add("properties.disks", "exactly one boot disk")
    for i, disk in enumerate(disks):
        fields = p.fields(disk, DISK, f"properties.disks[{i}]")
        init = p.fields(fields.get("initializeParams", {}), INIT, f"properties.disks[{i}].initializeParams")
        if fields.get("boot") and not isinstance(init.get("sourceImage"), str):
            p.add(f"properties.disks[{i}].initializeParams.sourceImage", "the boot disk needs an image")
        size = init.get("diskSizeGb", "10")
        if not str(size).isdigit() or not 10 <= int(str(size)) <= 65536:
            p.add(f"properties.disks[{i}].initializeParams.diskSizeGb", "10 to 65536 (GB)")


def _interfaces(p: Problems, nics: Any) -> None:
    if not isinstance(nics, list) or not nics:
        p.add("properties.networkInterfaces", "at least one network interface")
        return
    for i, nic in enumerate(nics):
        fields = p.fields(nic, NIC, f"properties.networkInterfaces[{i}]")
        if not (fields.get("network") or fields.get("subnetwork")):
            p.add(f"properties.networkInterfaces[{i}]", "needs a network or a subnetwork")
        for j, access in enumerate(fields.get("accessConfigs", [])):
            p.fields(access, ACCESS, f"properties.networkInterfaces[{i}].accessConfigs[{j}]")


def _metadata(p: Problems, metadata: Any) -> None:
    fields = p.fields(metadata, {"items"}, "properties.metadata")
    items = fields.get("items", [])
    if not isinstance(items, list):
        p.add("properties.metadata.items", "must be a list")
        return
    keys: list[str] = []
    total = 0
    for i, item in enumerate(items):
        entry = p.fields(item, {"key", "value"}, f"properties.metadata.items[{i}]")
        key, value = entry.get("key"), entry.get("value", "")
        if not isinstance(key, str) or not METADATA_KEY.match(key) or not isinstance(value, str):
            p.add(f"properties.metadata.items[{i}]", "a key of letters, digits, '-', '_' and a string value")
            continue
        keys.append(key)
        total += len(key) + len(value.encode())
        if len(value.encode()) > METADATA_VALUE_LIMIT:
            p.add(f"properties.metadata.items[{i}].value", "at most 256 KB")
    if len(keys) != len(set(keys)):
        p.add("properties.metadata.items", "duplicate keys")
    if total > METADATA_TOTAL_LIMIT:
        p.add("properties.metadata", "at most 512 KB in all")


def template_name(reference: str, project: str) -> str | None:
    """The template a group body names (a URL, ``projects/P/global/...`` or ``global/...``), in ``project``."""
    match = re.fullmatch(
        r"(?:(?:https?://[^/]+/compute/v1/)?projects/([^/]+)/)?global/instanceTemplates/([a-z][-a-z0-9]*)", reference
    )
    if match is None or match.group(1) not in (None, project):
        return None
    return match.group(2)


def group_problems(body: Any, templates: Mapping[str, Any], project: str, zone: str) -> list[str]:
    p = Problems()
    group = p.fields(body, GROUP_FIELDS, "")
    if not NAME.match(str(group.get("name", ""))):
        p.add("name", "must be a lowercase RFC 1035 name of at most 63 characters")
    base = str(group.get("baseInstanceName", ""))
    if not NAME.match(base) or len(base) > 58:
        p.add("baseInstanceName", "a lowercase RFC 1035 name of at most 58 characters (the group adds a suffix)")
    name = template_name(str(group.get("instanceTemplate", "")), project)
    if name is None or name not in templates:
        p.add("instanceTemplate", f"The resource '{group.get('instanceTemplate')}' was not found")
    size = group.get("targetSize", 0)
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= 1000:
        p.add("targetSize", "a whole number from 0")
    if "zone" in group and str(group["zone"]).rsplit("/", 1)[-1] != zone:
        p.add("zone", f"the group is inserted in {zone}")
    policy = p.fields(group.get("instanceLifecyclePolicy", {}), LIFECYCLE, "instanceLifecyclePolicy")
    if policy.get("defaultActionOnFailure", "REPAIR") not in ("REPAIR", "DO_NOTHING"):
        p.add("instanceLifecyclePolicy.defaultActionOnFailure", "REPAIR or DO_NOTHING")
    return p.found
