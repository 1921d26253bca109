"""Run by tests/runtime/test_handed_step.py in a process of its own (the abort severs every TCP connection of the
process): a generation handed a held step, blocked on a peer, is aborted by its agent's abort file."""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from worker_agent.contract import CommittedCheckpoint, ControlDir
from worker_agent.runtime.errors import GenerationAbandoned
from worker_agent.runtime.pipeline.comm import Communicators
from worker_agent.runtime.process.meeting import handed_step


def main(folder: Path, scenario: str) -> dict[str, Any]:
    control = ControlDir(folder / "control")
    control.path.mkdir(parents=True)
    cfg: Any = SimpleNamespace(held=CommittedCheckpoint(7, 1), generation=2)
    process: Any = SimpleNamespace(held=object(), communicators=Communicators())
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    mine, _ = listener.accept()  # a peer that never sends: the exchange or the rendezvous blocked on it
    threading.Timer(0.5, control.request_abort).start()  # its agent's abort
    try:
        with handed_step(cfg, control, process) as abandoned:
            if scenario == "blocked":
                if not mine.recv(1):  # severed: the peer's bytes never come
                    raise ConnectionError("connection closed by peer")
            else:  # "after": the block's collectives are done; the abort comes before its verdict
                while not abandoned():
                    time.sleep(0.01)
    except GenerationAbandoned as exc:
        return {"raised": "GenerationAbandoned", "message": str(exc)}
    finally:
        peer.close()
    return {"raised": None}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), sys.argv[2])))
