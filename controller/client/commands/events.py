"""``spotmorph events [--follow]``: the controller's event log (JSON lines with --json)."""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Mapping
from typing import Any

from controller.client.commands.common import add_client_arguments, call, number
from morphing.validation import STORABLE_INT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job", default="", help="only this job's events")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    parser.add_argument("--after", metavar="SEQ", help="only events after this sequence number")
    parser.add_argument("--decision", metavar="N", help="only what decision N wrote (each line names its decision: dN)")
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
                print(json.dumps(row), flush=True)
            else:
                stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.at))
                who = " ".join(x for x in (event.job, event.node) if x)
                decided = f"d{event.decision}" if event.decision else "-"
                print(f"{event.seq:>6} {stamp} {decided:>6} {event.kind:<22} {who:<16} {describe(data)}", flush=True)
        return 0

    _, code = call(args, stream)
    return code
