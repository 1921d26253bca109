"""A VM's proof of which instance it is, as the controller's Identity service takes it.

Some clouds sign a document for a VM on request (GCP: the metadata server's instance identity token). A
provider that can check one against its group implements :class:`IdentityVerifier`; the API's Identity
service (:mod:`controller.api.identity`) then hands the VM the agent token of the instance it proved, so no
token has to be written onto the VM from outside (as Azure's Run Command does).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


class IdentityRefused(Exception):
    """The document proves no instance of this controller's group; ``str()`` says why, for the caller."""


class IdentityUnavailable(Exception):
    """The document cannot be checked right now (the group cannot be listed, the keys fetched): ask again."""


class IdentityNotOffered(Exception):
    """This controller hands out no per-VM tokens for identity documents (the operator turned it off)."""


@runtime_checkable
class IdentityVerifier(Protocol):
    async def verify_identity(self, document: str) -> str:
        """The instance id (the VM's name, its node name) ``document`` proves.

        Raises :class:`IdentityRefused`, :class:`IdentityUnavailable` (the VM asks again) or
        :class:`IdentityNotOffered`."""
        ...
