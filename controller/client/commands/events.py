"""``spotmorph events [--follow]``: the controller's event log (JSON lines with --json)."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controller.client.commands.common import add_client_arguments, call, number
from morphing.validation import STORABLE_INT

if TYPE_CHECKING:
    from protos.spotmorph.v1.controller_pb2 import Stimulus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", default="", help="only this job's events")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--after", metavar="SEQ", help="only events after this sequence number")
    parser.add_argument(
        "--decision",
        metavar="N",
        help="only what decision N wrote (each line names its decision, dN, and ends with what triggered it: <- ...)",
    )
    add_client_arguments(parser)


BARE = re.compile(r"[\w.:/@+,()-]+")  # a value printed as it is; anything else is quoted (JSON)


def describe(data: Mapping[str, Any]) -> str:
    """An event's fields as ``key=value`` words: numbers short, words bare, anything with spaces quoted."""
    return " ".join(f"{key}={_word(value)}" for key, value in data.items())


def _word(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, str) and BARE.fullmatch(value):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def triggered(stimulus: Stimulus) -> str:
    """What triggered an event's decision (a ``pb.Stimulus``), in a few words; "" when the log does not say."""
    kind, source = stimulus.kind, stimulus.source
    if not kind:
        return ""
    if kind == "node_call":
        incarnation = f"#{stimulus.incarnation}" if stimulus.HasField("incarnation") else ""
        job = f" ({stimulus.job})" if stimulus.job else ""
        return f"{source} {stimulus.node or '(new node)'}{incarnation}{job}"
    if kind == "job_call":
        return f"{source} {stimulus.job} by {stimulus.caller or '?'}"
    return f"{kind} {source}"  # tick heartbeat-expiry, provider ListInstances


def stimulus_row(stimulus: Stimulus) -> dict[str, Any] | None:
    """The stimulus as ``--json`` prints it (None: the decision is older than their record)."""
    if not stimulus.kind:
        return None
    row: dict[str, Any] = {"kind": stimulus.kind, "source": stimulus.source}
    row |= {"node": stimulus.node or None, "job": stimulus.job or None, "caller": stimulus.caller or None}
    row["incarnation"] = stimulus.incarnation if stimulus.HasField("incarnation") else None
    return row


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    after = number("--after", args.after, 0, STORABLE_INT, "give an event's sequence number, 0 or more") or 0
    fix = "give a decision number (the dN of a line), 0 or more"
    decision = number("--decision", args.decision, 0, STORABLE_INT, fix) or 0

    def stream(channel: Any) -> int:
        request = pb.WatchEventsRequest(after_seq=after, job=args.job, follow=args.follow, decision=decision)
        for event in rpc.JobsStub(channel).WatchEvents(request):
            data = json.loads(event.data_json or "{}")
            if args.json:
                row = {"seq": event.seq, "at": event.at, "kind": event.kind, "job": event.job or None}
                row |= {"node": event.node or None, "data": data, "decision": event.decision or None}
                row["stimulus"] = stimulus_row(event.stimulus)
                print(json.dumps(row), flush=True)
            else:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
                who = " ".join(x for x in (event.job, event.node) if x)
                decided = f"d{event.decision}" if event.decision else "-"
                why = triggered(event.stimulus)
                line = f"{event.seq:>6} {stamp} {decided:>6} {event.kind:<22} {who:<16} {describe(data)}"
                print(f"{line}  <- {why}" if why else line, flush=True)
        return 0

    _, code = call(args, stream)
    return code
