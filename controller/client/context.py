"""The client context: where ``spotmorph local up`` left the controller's address and token.

Clients find the controller from ``--controller``, else ``SPOTMORPH_CONTROLLER``, else this file;
credentials from ``--token``, else ``SPOTMORPH_TOKEN``, else the token file it names. It lives in
``$SPOTMORPH_HOME`` (default ``~/.spotmorph``), so tests and several users stay apart.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from controller.files import CONFIG_LIMIT, TOKEN_LIMIT, read_small_text


def spotmorph_home() -> Path:
    return Path(os.environ.get("SPOTMORPH_HOME") or "~/.spotmorph").expanduser()


def context_path(home: Path | None = None) -> Path:
    """The context file of ``home`` (default: ``$SPOTMORPH_HOME``)."""
    return (home or spotmorph_home()) / "context.json"


@dataclass(frozen=True)
class Context:
    controller: str
    token_file: str
    cluster_dir: str = ""
    imds_url: str = ""
    agent_token_file: str = ""  # no longer written (each VM has a token of its own); older context files have it
    slots: int = 1
    gpus_per_node: int = 0  # a local cluster's GPUs of this host per VM (0: CPU slots)

    def token(self) -> str:
        """The token the file names; "" when it is missing (the controller then says who may call)."""
        path = Path(self.token_file)
        if not self.token_file or not path.exists():
            return ""
        return read_small_text(path, f"the token file of {context_path()}", TOKEN_LIMIT).strip()


def read_context(home: Path | None = None) -> Context | None:
    """The context; None when there is none or it is not one (a FIFO or a huge file is a UserInputError)."""
    path = context_path(home)
    if not path.exists():
        return None
    try:
        return Context(**json.loads(read_small_text(path, "context", CONFIG_LIMIT)))
    except (json.JSONDecodeError, TypeError):
        return None


def write_context(context: Context, home: Path | None = None) -> Path:
    path = context_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(context), indent=2))
    tmp.replace(path)
    return path


def remove_context(home: Path | None = None) -> None:
    context_path(home).unlink(missing_ok=True)
