"""``spotmorph gcp agent-token``: a GCP worker VM trades its identity token for its own agent token.

The startup script (deploy/gcp/startup.sh) runs it before it starts the agent. It asks the metadata server
for this VM's instance identity token (a JWT Google signs, naming the VM, for the controller's audience),
sends it to the controller's Identity service, and writes the agent token it gets back where the agent
reads it (``--out``, mode 0640, group ``spotmorph`` when there is one; written beside, then renamed, so the
agent never reads half a token). Why a step of its own rather than the agent's: the agent stays the same
on every cloud (a token file, as on Azure or a node added by hand), and a restarted agent needs no new
exchange. Until ``--wait`` seconds have passed it retries whatever may pass (the controller not up yet,
the instance not listed yet); a controller whose provider takes no identity tokens exits 2 at once.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import logging
import os
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

from morphing.errors import UserInputError

METADATA = "http://metadata.google.internal"
IDENTITY = "/computeMetadata/v1/instance/service-accounts/default/identity"
MAX_TOKEN = 16 << 10
MAX_PAUSE_SECONDS = 30.0
log = logging.getLogger("spotmorph.gcp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="gcp_command", metavar="SUBCOMMAND", required=True)
    token = sub.add_parser(
        "agent-token", help="on a worker VM: trade its identity token for its own agent token (startup script)"
    )
    token.add_argument("--controller", required=True, metavar="HOST:PORT[,HOST:PORT]", help="the controller(s)")
    token.add_argument(
        "--audience", required=True, help="the audience the controller checks (gcp.identity_audience; docs/gcp.md)"
    )
    token.add_argument("--out", type=Path, default=Path("/etc/spotmorph/agent.token"), help="default %(default)s")
    token.add_argument("--ca", type=Path, help="cluster CA certificate (TLS)")
    token.add_argument("--cert", type=Path, help="agent client certificate (mutual TLS)")
    token.add_argument("--key", type=Path, help="agent client key (mutual TLS)")
    token.add_argument("--metadata-url", default=METADATA, help="the metadata server (default %(default)s)")
    token.add_argument("--wait", type=float, default=600.0, metavar="SECONDS", help="retry this long (default 600)")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s spotmorph gcp %(message)s")
    from protos.addresses import parse_addresses

    addresses = parse_addresses(args.controller, "--controller")
    deadline = time.monotonic() + max(0.0, args.wait)
    pause = 1.0
    while True:
        why = _attempt(args, addresses)
        if why is None:
            return 0
        if time.monotonic() + pause > deadline:
            raise SystemExit(f"spotmorph gcp agent-token: no agent token within --wait {args.wait:g} s: {why}")
        log.info("%s; asking again in %g s", why, pause)
        time.sleep(pause)
        pause = min(MAX_PAUSE_SECONDS, pause * 2)


def _attempt(args: argparse.Namespace, addresses: tuple[str, ...]) -> str | None:
    """One try: None once the token is written, else why not (worth another try); UserInputError if never."""
    try:
        document = identity_token(args.metadata_url, args.audience)
    except (OSError, ValueError) as exc:
        return f"the metadata server gave no identity token ({' '.join(str(exc).split())[:200]})"
    why = "no controller listed"
    for address in addresses:
        answer = exchange(address, document, args.ca, args.cert, args.key)
        if isinstance(answer, str):
            why = f"{address}: {answer}"
            continue
        instance, token = answer
        write_token(args.out, token)
        log.info("wrote the agent token of instance %s to %s", instance, args.out)
        print(instance)
        return None
    return why


def identity_token(metadata_url: str, audience: str) -> str:
    """This VM's identity token for ``audience`` (``format=full``: the claims name the VM)."""
    url = f"{metadata_url.rstrip('/')}{IDENTITY}?audience={quote(audience, safe='')}&format=full"
    request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})
    with urllib.request.urlopen(request, timeout=10) as response:  # the metadata server: plain HTTP on the VM
        if response.headers.get("Metadata-Flavor") != "Google":
            raise ValueError("the answer is not the metadata server's (no Metadata-Flavor: Google)")
        body: bytes = response.read(MAX_TOKEN + 1)
    if len(body) > MAX_TOKEN or not body.isascii():
        raise ValueError("the answer is no token")
    return body.decode().strip()


def exchange(
    address: str, document: str, ca: Path | None, cert: Path | None, key: Path | None
) -> tuple[str, str] | str:
    """(instance, agent token) from the controller at ``address``, or why not (another try may pass)."""
    import grpc

    from controller.client.connection import channel
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    with channel(address, None, ca, cert, key) as opened:
        try:
            reply = rpc.IdentityStub(opened).ExchangeIdentity(
                pb.ExchangeIdentityRequest(identity_token=document), timeout=20
            )
        except grpc.RpcError as exc:
            code, detail = exc.code(), " ".join(str(exc.details() or "").split())[:300]
            if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT):
                raise UserInputError(f"{address} will not hand out agent tokens: {detail}") from None
            return f"{code.name}: {detail}"
    if not reply.agent_token or "\n" in reply.agent_token or len(reply.agent_token) > 512:
        return "the controller's answer holds no token"
    return reply.instance_id, reply.agent_token


def write_token(path: Path, token: str) -> None:
    """``token`` in ``path``, mode 0640 and group spotmorph (when it exists), replacing what was there at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.new")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    with os.fdopen(descriptor, "w") as file:
        file.write(f"{token}\n")
    # No such group (a test, a custom image), or not root: the agent's user must read it then.
    with contextlib.suppress(KeyError, PermissionError):
        os.chown(partial, -1, grp.getgrnam("spotmorph").gr_gid)
    os.chmod(partial, 0o640)
    os.replace(partial, path)
