"""The JSON the fake ARM server answers for a scale set and its VMs (tests/azure/fake_arm.py)."""

from __future__ import annotations

from typing import Any

# ``fake``: a FakeArm (one scale set), ``vm``: one of its FakeVm (typed Any: the server imports this module).


def vmss_json(fake: Any) -> dict[str, Any]:
    state = "Updating" if fake.in_progress() else "Succeeded"
    return {
        "id": fake._vmss_path,
        "name": fake.scale_set,
        "type": "Microsoft.Compute/virtualMachineScaleSets",
        "location": fake.location,
        "sku": {"name": "Standard_NC24ads_A100_v4", "tier": "Standard", "capacity": fake.capacity},
        "properties": {
            "provisioningState": state,
            "orchestrationMode": fake.orchestration,
            "singlePlacementGroup": False,
            "virtualMachineProfile": {
                "priority": "Spot",
                "evictionPolicy": fake.eviction_policy,
                "billingProfile": {"maxPrice": fake.max_price},
            },
        },
    }


def _statuses(vm: Any) -> list[dict[str, str]]:
    return [
        {"code": f"ProvisioningState/{vm.provisioning.lower()}", "level": "Info"},
        {"code": f"PowerState/{vm.power}", "level": "Info"},
    ]


def uniform_json(fake: Any, vm: Any) -> dict[str, Any]:
    return {
        "id": f"{fake._vmss_path}/virtualMachines/{vm.instance_id}",
        "name": vm.name,
        "instanceId": vm.instance_id,
        "location": fake.location,
        "properties": {
            "provisioningState": vm.provisioning,
            "osProfile": {"computerName": f"{fake.scale_set}{int(vm.instance_id):06x}"},
            "instanceView": {"statuses": _statuses(vm)},
        },
    }


def flexible_json(fake: Any, vm: Any) -> dict[str, Any]:
    return {
        "id": f"{fake._vmss_path.rsplit('/', 2)[0]}/virtualMachines/{vm.name}",
        "name": vm.name,
        "location": fake.location,
        "properties": {
            "provisioningState": vm.provisioning,
            "virtualMachineScaleSet": {"id": fake._vmss_path},
            "instanceView": {"statuses": _statuses(vm)},
        },
    }


def _priority(fake: Any) -> dict[str, Any]:
    """Spot: evicted per its policy, at most its max price; Regular: on-demand, neither."""
    if fake.priority != "Spot":
        return {"priority": fake.priority}
    return {"priority": "Spot", "evictionPolicy": fake.eviction_policy, "billingProfile": {"maxPrice": fake.max_price}}
