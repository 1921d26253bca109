"""The client context: where ``spotmorph local up`` left the controller's address and token.

Clients find the controller from ``--controller``, else ``SPOTMORPH_CONTROLLER``, else this file, whose
``controller`` is one ``HOST:PORT`` or, for several controllers (one leads, the others stand by), a list of them;
credentials from ``--token``, else ``SPOTMORPH_TOKEN``, else the token file it names. It lives in
``$SPOTMORPH_HOME`` (default ``~/.spotmorph``), so tests and several users stay apart.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from controller.files import CONFIG_LIMIT, TOKEN_LIMIT, read_small_text


def spotmorph_home() -> Path:
    return Path(os.environ.get("SPOTMORPH_HOME") or "~/.spotmorph").expanduser()


def context_path(home: Path | None = None) -> Path:
    """The context file of ``home`` (default: ``$SPOTMORPH_HOME``)."""
    return (home or spotmorph_home()) / "context.json"


@dataclass(frozen=True)
class Context:
    controller: str  # the first controller: the one address of a single controller (what agents are given)
    token_file: str
    cluster_dir: str = ""
    imds_url: str = ""
    agent_token_file: str = ""  # no longer written (each VM has a token of its own); older context files have it
    slots: int = 1
    gpus_per_node: int = 0  # a local cluster's GPUs of this host per VM (0: CPU slots)
    controllers: tuple[str, ...] = ()  # every controller, in the order clients try them; () means just controller

    def addresses(self) -> tuple[str, ...]:
        """The controllers a client tries, in order."""
        return self.controllers or ((self.controller,) if self.controller else ())

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
        return _from_json(json.loads(read_small_text(path, "context", CONFIG_LIMIT)))
    except (json.JSONDecodeError, TypeError):
        return None


def _from_json(data: Any) -> Context:
    """A context from the file's object: ``controller`` a string (older files, one controller) or a list."""
    if not isinstance(data, dict):
        raise TypeError("not an object")
    controllers = data.pop("controller", None)
    if isinstance(controllers, str):
        return Context(controller=controllers, **data)
    if not isinstance(controllers, list) or not controllers or not all(isinstance(c, str) for c in controllers):
        raise TypeError("controller is neither an address nor a list of them")
    return Context(controller=controllers[0], controllers=tuple(controllers), **data)


def _to_json(context: Context) -> dict[str, Any]:
    """The file's object: one controller as a string, as older readers expect; several as a list."""
    data = asdict(replace(context, controllers=()))
    del data["controllers"]
    if len(context.addresses()) > 1:
        data["controller"] = list(context.addresses())
    return data


def write_context(context: Context, home: Path | None = None) -> Path:
    path = context_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(_to_json(context), indent=2))
    tmp.replace(path)
    return path


def remove_context(home: Path | None = None) -> None:
    context_path(home).unlink(missing_ok=True)
