"""A local AWS instance metadata service (IMDSv2, tokens required) for the local cluster's VMs.

The local cluster started with ``--cloud aws`` serves its notices through it, so the agent's AWS code path is the
one that runs on EC2. Each VM's metadata lives under ``/VM`` (:mod:`.metadata_http`):

- ``PUT /VM/latest/api/token`` with ``X-aws-ec2-metadata-token-ttl-seconds`` (1 to 21600) gives a session token;
  without the header, or outside that range: 400;
- every ``GET /VM/latest/meta-data/...`` needs a live token of that VM in ``X-aws-ec2-metadata-token`` (401
  otherwise, as IMDSv2 answers once tokens are required);
- ``spot/instance-action``: 404 until an interruption is scheduled, then
  ``{"action": "terminate", "time": "2026-11-29T01:02:03Z"}``; ``events/recommendations/rebalance``: 404, or
  ``{"noticeTime": "..."}`` once recommended.
- Admin (not AWS's): ``POST /admin/instance-action`` ``{"vm", "action", "notice_seconds"}`` schedules an
  interruption; ``POST /admin/rebalance`` ``{"vm"}`` recommends a rebalance, ``DELETE /admin/rebalance/VM`` takes
  it back; ``GET /admin/state`` shows every VM's.

The platform (:mod:`.platform`) evicts a VM once its interruption's time has come (AWS takes no acknowledgement).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spotmorph.local.metadata_http import Handler, Serving, seconds, vm_name

TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
ACTIONS = ("terminate", "stop", "hibernate")
MAX_TTL = 21_600
MAX_NOTICE = 86_400.0


def aws_time(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class _Action:
    action: str
    at: float  # epoch seconds


class AwsMetadataState:
    """Every VM's tokens, interruption and rebalance recommendation; thread-safe, the clock injected."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (VM, expires at)
        self._actions: dict[str, _Action] = {}
        self._rebalances: dict[str, float] = {}  # VM -> when recommended

    def issue_token(self, vm: str, ttl: int) -> str:
        now = self._clock()
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens = {t: held for t, held in self._tokens.items() if held[1] > now}  # the expired ones go
            self._tokens[token] = (vm, now + ttl)
        return token

    def token_ok(self, vm: str, token: str) -> bool:
        with self._lock:
            held = self._tokens.get(token)
        return held is not None and held[0] == vm and held[1] > self._clock()

    def schedule(self, vm: str, action: str, notice_seconds: float) -> str:
        """An interruption of ``vm`` in ``notice_seconds``; returns its time as AWS writes it."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, not {action[:32]!r}")
        at = float(int(self._clock() + notice_seconds))  # AWS's times are whole seconds
        with self._lock:
            self._actions[vm] = _Action(action, at)
        return aws_time(at)

    def recommend_rebalance(self, vm: str) -> str:
        at = float(int(self._clock()))
        with self._lock:
            self._rebalances.setdefault(vm, at)
            return aws_time(self._rebalances[vm])

    def withdraw_rebalance(self, vm: str) -> bool:
        with self._lock:
            return self._rebalances.pop(vm, None) is not None

    def instance_action(self, vm: str) -> dict[str, str] | None:
        with self._lock:
            action = self._actions.get(vm)
        return None if action is None else {"action": action.action, "time": aws_time(action.at)}

    def rebalance(self, vm: str) -> dict[str, str] | None:
        with self._lock:
            at = self._rebalances.get(vm)
        return None if at is None else {"noticeTime": aws_time(at)}

    def due(self) -> list[str]:
        """The VMs whose interruption's time has come."""
        now = self._clock()
        with self._lock:
            return [vm for vm, action in self._actions.items() if action.at <= now]

    def forget(self, vm: str) -> None:
        """``vm`` is gone: its interruption and recommendation with it."""
        with self._lock:
            self._actions.pop(vm, None)
            self._rebalances.pop(vm, None)

    def view(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            vms = sorted({*self._actions, *self._rebalances})
        return {vm: {"instance-action": self.instance_action(vm), "rebalance": self.rebalance(vm)} for vm in vms}


class _AwsHandler(Handler):
    server: Any

    @property
    def state(self) -> AwsMetadataState:
        state: AwsMetadataState = self.server.state
        return state

    def do_PUT(self) -> None:
        where = self.split_vm()
        if where is None or where[1] != TOKEN_PATH:
            self.send_text(404, "Not Found")
            return
        try:
            ttl = int(self.headers.get(TTL_HEADER) or "")
        except ValueError:
            ttl = 0
        if not 1 <= ttl <= MAX_TTL:
            self.send_text(400, f"{TTL_HEADER} must be 1 to {MAX_TTL}")
            return
        self.send_text(200, self.state.issue_token(where[0], ttl), {TTL_HEADER: str(ttl)})

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/admin/state":
            self.send_json(200, self.state.view())
            return
        where = self.split_vm()
        if where is None or not where[1].startswith("/latest/meta-data/"):
            self.send_text(404, "Not Found")
            return
        vm, path = where
        if not self.state.token_ok(vm, self.headers.get(TOKEN_HEADER) or ""):
            self.send_text(401, "Unauthorized")
            return
        document = {INSTANCE_ACTION: self.state.instance_action, REBALANCE: self.state.rebalance}.get(path)
        found = None if document is None else document(vm)
        if found is None:
            self.send_text(404, "Not Found")
        else:
            self.send_json(200, found)

    def do_POST(self) -> None:
        body = self.json_object()
        if body is None:
            return
        try:
            vm = vm_name(body.get("vm"))
            if self.path == "/admin/instance-action":
                notice = seconds(body.get("notice_seconds", 120), "notice_seconds", MAX_NOTICE)
                time_ = self.state.schedule(vm, str(body.get("action", "terminate")), notice)
                self.send_json(201, {"vm": vm, "time": time_})
            elif self.path == "/admin/rebalance":
                self.send_json(201, {"vm": vm, "noticeTime": self.state.recommend_rebalance(vm)})
            else:
                self.send_json(404, {"error": "no such admin endpoint"})
        except ValueError as exc:
            self.send_json(400, {"error": str(exc)})

    def do_DELETE(self) -> None:
        prefix = "/admin/rebalance/"
        if self.path.startswith(prefix) and self.state.withdraw_rebalance(self.path[len(prefix) :]):
            self.send_json(200, {})
        else:
            self.send_json(404, {"error": "no such recommendation"})


class AwsMetadataServer(Serving):
    """The service on ``host:port`` (port 0 picks a free one) in a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, state: AwsMetadataState | None = None) -> None:
        self.state = state or AwsMetadataState()
        super().__init__(host, port, _AwsHandler, self.state, "aws-metadata")

    def start(self) -> AwsMetadataServer:
        self.start_serving()
        return self
