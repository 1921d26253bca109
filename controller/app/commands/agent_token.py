"""``spotmorph agent-token --state-dir DIR --instance-id ID``: the agent token of one VM, for a manual node.

Providers hand their VMs' tokens out themselves (``provider: local``); a node an operator adds by hand
needs one too. Run this on the controller's machine (it reads the controller's secret in DIR), give the
token to that VM's agent (``--token-file``), and start it there: it registers as instance ID, and no
other VM can take its node while it is alive.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from controller.tokens import NODE_SECRET, issue_vm_token
from morphing.errors import UserInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", type=Path, required=True, help="the controller's state directory")
    parser.add_argument("--instance-id", required=True, help="the VM's id (its provider's, or its host name)")


def run(args: argparse.Namespace) -> int:
    secret = args.state_dir / NODE_SECRET
    if not secret.is_file():
        raise UserInputError(
            f"--state-dir {args.state_dir}: no {NODE_SECRET} there; give the controller's state directory "
            "(a controller started with it once writes the file)"
        )
    try:
        print(issue_vm_token(args.state_dir, args.instance_id))
    except OSError as exc:
        raise UserInputError(f"--state-dir {args.state_dir}: cannot read {NODE_SECRET} ({exc.strerror})") from None
    return 0
