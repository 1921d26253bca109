"""The notice source of ``spotmorph agent --cloud``: one interface (:class:`~.facts.NoticeSource`), so the agent's
eviction side polls whichever cloud it runs on and hears the same facts."""

from __future__ import annotations

from collections.abc import Callable

from worker_agent.notices.aws import AwsMetadataClient, AwsNoticeSource
from worker_agent.notices.azure import AzureNoticeSource
from worker_agent.notices.facts import Cloud, NoticeSource
from worker_agent.notices.gcp import GcpMetadataClient, GcpNoticeSource

# The clouds that warn of an elevated risk of eviction before the notice, as the agent reads them (Azure's is a
# preview whose wire format is not documented: worker_agent.notices.azure).
WARNING_CLOUDS: tuple[Cloud, ...] = ("aws",)


def notice_source(cloud: Cloud, base_url: str, vm_name: Callable[[], str], poll_seconds: float = 1.0) -> NoticeSource:
    """``cloud``'s source at ``base_url`` (its metadata service); ``vm_name``: this VM's name (Azure's events name
    the VMs they evict; AWS's and GCP's metadata is the VM's own)."""
    if cloud == "aws":
        return AwsNoticeSource(AwsMetadataClient(base_url), poll_seconds)
    if cloud == "gcp":
        return GcpNoticeSource(GcpMetadataClient(base_url), poll_seconds)
    return AzureNoticeSource(base_url, vm_name, poll_seconds)
