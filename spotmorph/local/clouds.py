"""Which cloud a local cluster plays (``spotmorph local up --cloud azure|aws|gcp``), and what that changes.

The platform serves that cloud's metadata service (:mod:`.imds_server`, :mod:`.aws_metadata`,
:mod:`.gcp_metadata`), every VM's agent runs with ``--cloud`` and the URL of its own metadata, and ``local
preempt`` and ``local rebalance`` go through that cloud's own notice path. The choice is kept in the cluster's
``cloud`` file (:class:`~spotmorph.local.layout.ClusterDir`), so the provider and every command agree.
"""

from __future__ import annotations

from morphing.errors import UserInputError
from spotmorph.local.layout import ClusterDir
from worker_agent.notices.facts import CLOUDS, Cloud
from worker_agent.notices.sources import WARNING_CLOUDS

# Each cloud's usual notice (seconds): Azure's Preempt and GCP's shutdown about 30 s, AWS's about two minutes.
DEFAULT_NOTICE: dict[Cloud, float] = {"azure": 30.0, "aws": 120.0, "gcp": 30.0}


def check_cloud(text: str) -> Cloud:
    if text not in CLOUDS:
        raise UserInputError(f"--cloud {text!r}: give one of {', '.join(CLOUDS)}")
    return text


def read_cloud(files: ClusterDir) -> Cloud:
    """The cloud the cluster was started as; Azure for a cluster from before ``--cloud``."""
    try:
        text = files.cloud.read_text().strip()
    except FileNotFoundError:
        return "azure"
    return check_cloud(text)


def vm_metadata_url(cloud: Cloud, base_url: str, vm: str) -> str:
    """Where the agent of VM ``vm`` finds its metadata: Azure's Scheduled Events are one document naming the VMs
    they affect; AWS's and GCP's metadata is each VM's own."""
    return base_url if cloud == "azure" else f"{base_url.rstrip('/')}/{vm}"


def require_warning(cloud: Cloud) -> None:
    """``local rebalance`` only where the cloud warns before its notice; elsewhere a UserInputError saying where."""
    if cloud in WARNING_CLOUDS:
        return
    raise UserInputError(
        f"this local cluster plays {cloud}, which gives no early warning before an eviction notice that spotmorph "
        f"reads: only {', '.join(WARNING_CLOUDS)} does (AWS's rebalance recommendation; Azure's Spot rebalance "
        "recommendation is a preview whose Scheduled Events version and event type are not documented, and GCP "
        "documents none); start one with `spotmorph local up --cloud aws`"
    )
