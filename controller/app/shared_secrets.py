"""Secrets every controller of one PostgreSQL database shares: the node secret and the operator and reader tokens.

The first controller to start proposes its own (the files in its state directory, created when missing);
every later one takes the database's and writes it to its files, where the tools that read them (the CLI's
token file, ``spotmorph agent-token``) find it. So a token any controller issued or printed works at every
controller, and a node token survives a change of leader.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from controller.files import write_private
from controller.persistence.store import Store
from controller.tokens import NODE_SECRET, read_or_create_token

log = logging.getLogger("spotmorph.controller")


def share_secrets(store: Store, state_dir: Path, token_files: Sequence[tuple[Path, str, str]]) -> None:
    """Each of ``token_files`` (path, what it is, the name it is shared under) and the node secret: the database's
    value, written to the file."""
    for path, flag, name in [*token_files, (state_dir / NODE_SECRET, "node secret", NODE_SECRET)]:
        mine = read_or_create_token(path, flag)
        shared = store.shared_secret(name, mine)
        if shared != mine:
            log.warning("%s %s: replaced by the one the controllers of this database share", flag, path)
            write_private(path, f"{shared}\n".encode())
