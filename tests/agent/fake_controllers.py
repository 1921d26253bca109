"""Small fakes for the agent's tests with several controllers: an Agent servicer on a real gRPC server in this
process (a leader with an epoch, a standby naming a leader, or one that is down), addresses nothing listens at,
and a supervisor that only records what the agent asks of its trainers."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import grpc

from protos.reasons import LEADER_KEY, NOT_LEADER, REASON_KEY
from protos.spotmorph.v1 import controller_pb2 as pb
from protos.spotmorph.v1 import controller_pb2_grpc as rpc
from worker_agent.agent.converge import TrainerKey, TrainerStatus
from worker_agent.agent.progress import TrainerReport

NODE_TOKEN = "node-token"


@dataclass
class FakeController(rpc.AgentServicer):
    """One controller of several. It leads with ``epoch`` unless ``standby`` (it then refuses every call with
    not-leader, naming ``leader``) or ``down`` (UNAVAILABLE, as a controller that is going away answers)."""

    epoch: int = 1
    standby: bool = False
    leader: str = ""
    down: bool = False
    address: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)  # (method, bearer token) of every call
    heartbeats: list[pb.HeartbeatRequest] = field(default_factory=list)  # the ones it answered
    replies: list[pb.HeartbeatResponse] = field(default_factory=list)  # scripted heartbeat replies, then empty ones

    def _answer(self, method: str, context: grpc.ServicerContext) -> None:
        token = dict(context.invocation_metadata()).get("authorization", "")
        self.calls.append((method, str(token).removeprefix("Bearer ")))
        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "shutting down")
        if self.standby:
            context.set_trailing_metadata(((REASON_KEY, NOT_LEADER), (LEADER_KEY, self.leader)))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this controller is a standby")

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.RegisterResponse:
        self._answer("Register", context)
        return pb.RegisterResponse(
            node_name="node-1",
            incarnation=1,
            node_token=NODE_TOKEN,
            heartbeat_interval_seconds=1.0,
            heartbeat_expiry_seconds=10.0,
            epoch=self.epoch,
        )

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        self._answer("Heartbeat", context)
        self.heartbeats.append(request)
        reply = pb.HeartbeatResponse()
        reply.CopyFrom(self.replies.pop(0) if self.replies else pb.HeartbeatResponse())
        reply.epoch = self.epoch
        return reply

    def ReportEvent(self, request: pb.ReportEventRequest, context: grpc.ServicerContext) -> pb.ReportEventResponse:
        self._answer("ReportEvent", context)
        return pb.ReportEventResponse()

    def ReportLogs(self, request: pb.ReportLogsRequest, context: grpc.ServicerContext) -> pb.ReportLogsResponse:
        self._answer("ReportLogs", context)
        return pb.ReportLogsResponse()

    def methods(self) -> list[str]:
        return [method for method, _ in self.calls]

    def reported(self) -> bool:
        return "ReportEvent" in self.methods()


Start = Callable[..., FakeController]


@contextmanager
def serving() -> Iterator[Start]:
    """``start(port=0, **fields)``: a fake controller on loopback (``port``: one nothing listens at) until the block
    ends."""
    servers: list[grpc.Server] = []

    def one(port: int = 0, **fields: Any) -> FakeController:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        controller = FakeController(**fields)
        rpc.add_AgentServicer_to_server(controller, server)
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
        controller.address = f"127.0.0.1:{bound}"
        server.start()
        servers.append(server)
        return controller

    try:
        yield one
    finally:
        for server in servers:
            server.stop(None)


def silent_address() -> str:
    """An address nothing listens at (a port the system just handed out and took back): connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


@dataclass
class FakeSupervisor:
    """Trainers that only exist as reports: it records every kill and stop the agent asks for, and a stopped
    generation's trainers exit 0 at once (as a leaving node's do once their stop's checkpoint is written)."""

    trainers: dict[TrainerKey, TrainerReport] = field(default_factory=dict)
    killed: list[TrainerKey] = field(default_factory=list)
    stops: list[tuple[str, int, bool]] = field(default_factory=list)  # (job, generation, leaving)
    lease_seconds: float | None = 60.0

    @classmethod
    def training(cls, *keys: TrainerKey) -> FakeSupervisor:
        return cls({k: TrainerReport(TrainerStatus(k, True), pid=100 + k.rank, step=40) for k in keys})

    def reports(self) -> list[TrainerReport]:
        return list(self.trainers.values())

    def running(self) -> list[TrainerKey]:
        return [k for k, r in self.trainers.items() if r.status.running]

    def request_stop(self, job_id: str, generation: int, leaving: bool = False) -> None:
        self.stops.append((job_id, generation, leaving))
        for key, report in self.trainers.items():
            if (key.job_id, key.generation) == (job_id, generation):
                status = TrainerStatus(key, False, 0, stop_requested=True)
                self.trainers[key] = replace(report, status=status, step=41, last_checkpoint_step=41)

    def kill(self, key: TrainerKey) -> None:
        self.killed.append(key)
        self.trainers[key] = replace(self.trainers[key], status=TrainerStatus(key, False, -9))

    def end(self, key: TrainerKey, may_hold: bool = False) -> bool:
        """As :meth:`Supervisor.end` for trainers handed no held step: killed at once."""
        self.kill(key)
        return True

    def kill_all(self) -> None:
        for key in self.running():
            self.kill(key)

    def building(self) -> str:
        return ""

    def forget(self, keep: set[tuple[str, int]]) -> None:
        pass

    def renew_leases(self, job_id: str, generation: int) -> None:
        pass

    def acknowledge(self, job_id: str, generation: int, step: int) -> None:
        pass
