"""The Identity service: a VM trades a document its cloud signed for the agent token of the instance it proves.

Why here and not on the VM's own initiative alone: only the controller holds the secret agent tokens derive
from, and only the provider knows the group's instances. The VM asks (``spotmorph gcp agent-token`` in its
startup script); a document that proves an instance of the group gets that instance's token
(:meth:`controller.tokens.Tokens.vm_token`, the same the Azure provider hands out by Run Command). The call
needs no bearer token (:data:`controller.api.auth.OPEN_SERVICES`): the document is the credential, and what
it costs an anonymous caller is a size check and one RSA signature check before anything else happens.
A standby answers too: the secret is shared, and the provider lists the group on its own when it must.
"""

from __future__ import annotations

import logging

import grpc

from controller.api.auth import Tokens
from controller.api.status import Context, abort
from controller.providers.identity import (
    IdentityNotOffered,
    IdentityRefused,
    IdentityUnavailable,
    IdentityVerifier,
)
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc

log = logging.getLogger("spotmorph.controller.identity")
MAX_DOCUMENT = 16 << 10


class IdentityService(rpc.IdentityServicer):
    def __init__(self, tokens: Tokens, verifier: IdentityVerifier | None) -> None:
        """``verifier``: the provider, when it takes identity documents (None: this controller's does not)."""
        self.tokens = tokens
        self.verifier = verifier

    async def ExchangeIdentity(
        self, request: pb.ExchangeIdentityRequest, context: Context
    ) -> pb.ExchangeIdentityResponse:
        if self.verifier is None:
            await abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                "this controller's provider takes no identity documents (provider: gcp does); give the VM a "
                "token of its own with `spotmorph agent-token`",
            )
        document = request.identity_token
        if not document or len(document) > MAX_DOCUMENT:
            detail = "identity_token: a signed document of at most 16 KiB"
            await abort(context, grpc.StatusCode.INVALID_ARGUMENT, detail)
        try:
            instance = await self.verifier.verify_identity(document)
            token = self.tokens.vm_token(instance)  # a name no token can carry is refused (UserInputError)
        except (IdentityRefused, ValueError) as exc:
            log.warning("identity refused (%s): %s", context.peer(), exc)
            await abort(context, grpc.StatusCode.UNAUTHENTICATED, f"identity_token refused: {exc}")
        except IdentityNotOffered as exc:
            await abort(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except IdentityUnavailable as exc:
            await abort(context, grpc.StatusCode.UNAVAILABLE, f"cannot check identities right now: {exc}; retry")
        log.info("instance %s proved its identity and got its agent token (%s)", instance, context.peer())
        return pb.ExchangeIdentityResponse(instance_id=instance, agent_token=token)
