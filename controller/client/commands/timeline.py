"""``spotmorph timeline JOB --out FILE.html|FILE.png``: one picture of a job over time."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from controller.client.commands.common import add_client_arguments, call
from morphing.errors import UserInputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job id, e.g. job-1")
    parser.add_argument(
        "--out", type=Path, required=True, help="FILE.html (self-contained, inline SVG) or FILE.png (needs matplotlib)"
    )
    add_client_arguments(parser, json_flag=False)


def run(args: argparse.Namespace) -> int:
    from controller.client.timeline import build, render_html
    from controller.eventlog.fact import EventDataError
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    kind = args.out.suffix.lower()
    if kind not in (".html", ".htm", ".png"):
        raise UserInputError(
            f"--out {args.out}: write a .html file (a self-contained page with an SVG picture) or a .png image"
        )

    def fetch(channel: Any) -> tuple[Any, list[dict[str, Any]]]:
        stub = rpc.JobsStub(channel)
        job = stub.GetJob(pb.GetJobRequest(id=args.job))
        events = [
            {
                "at": e.at,
                "kind": e.kind,
                "job": e.job or None,
                "node": e.node or None,
                "data": json.loads(e.data_json or "{}"),
            }
            for e in stub.WatchEvents(pb.WatchEventsRequest(follow=False))
        ]
        return job, events

    found, code = call(args, fetch)
    if found is None:
        return code
    job, events = found
    try:
        timeline = build(events, job.id, job.spec.global_batch)
    except EventDataError as exc:  # a controller of another version, or a damaged log: say which event
        print(f"error: cannot draw {job.id}'s timeline: {exc}", file=sys.stderr)
        return 1
    title = f"{job.id} ({job.name}): {len(timeline.generations)} generation(s)"
    if kind == ".png":
        from controller.client.timeline_png import render_png

        render_png(timeline, title, args.out)
    else:
        try:
            args.out.write_text(render_html(timeline, title))
        except OSError as exc:
            raise UserInputError(f"--out {args.out}: cannot write it ({exc.strerror})") from None
    print(f"wrote {args.out}: {len(timeline.generations)} generation(s), {len(timeline.checkpoints)} checkpoint(s)")
    return 0
