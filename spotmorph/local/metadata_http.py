"""What the local AWS and GCP metadata services share: answering, reading an admin body, serving in a thread.

Both serve every local VM's metadata on one port, each VM under a path of its own (``/vm-3/...``): the VM's
agent gets ``--imds-url http://HOST:PORT/vm-3``, and sees only its own, as a VM on the cloud does at the
link-local address.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VM_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_ADMIN_BODY = 64 * 1024


class Handler(BaseHTTPRequestHandler):
    """Quiet, with helpers to answer JSON or text and to read a small JSON object (the admin endpoints')."""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def send(self, code: int, body: bytes, content_type: str, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, code: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        self.send(code, json.dumps(body).encode(), "application/json", headers)

    def send_text(self, code: int, text: str, headers: Mapping[str, str] | None = None) -> None:
        self.send(code, text.encode(), "text/plain", headers)

    def json_object(self) -> dict[str, Any] | None:
        """The request's body as a JSON object; None (after answering 400) when it is not one."""
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_ADMIN_BODY:
            self.send_json(400, {"error": f"a body of at most {MAX_ADMIN_BODY} bytes"})
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self.send_json(400, {"error": "the body is not a JSON object"})
            return None
        return body

    def split_vm(self) -> tuple[str, str] | None:
        """``/VM/rest`` as (VM, ``/rest`` without the query); None for a path that names no VM."""
        path = self.path.split("?", 1)[0]
        vm, _, rest = path.lstrip("/").partition("/")
        return (vm, f"/{rest}") if VM_NAME.fullmatch(vm) and vm != "admin" else None


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a hanging GET (GCP's wait_for_change) must not hold up shutdown

    def __init__(self, address: tuple[str, int], handler: type[Handler], state: Any) -> None:
        super().__init__(address, handler)
        self.state = state


class Serving:
    """A service on ``host:port`` (port 0 picks a free one) in a background thread."""

    def __init__(self, host: str, port: int, handler: type[Handler], state: Any, name: str) -> None:
        self._server = Server((host, port), handler, state)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start_serving(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def vm_name(value: object) -> str:
    """An admin body's ``vm``: a VM's name as the local cluster gives them (``vm-3``), else a ValueError."""
    if not isinstance(value, str) or not VM_NAME.fullmatch(value):
        raise ValueError(f"vm must be a VM's name such as vm-1, not {str(value)[:64]!r}")
    return value


def seconds(value: object, field: str, most: float) -> float:
    """An admin body's number of seconds, from 0 to ``most``, else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= most:
        raise ValueError(f"{field} must be a number of seconds from 0 to {most:g}")
    return float(value)
