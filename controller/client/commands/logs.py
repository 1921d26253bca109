"""``spotmorph logs JOB [--follow] [--rank R] [--generation G] [--json]``: what a job's trainers wrote.

Every rank's stdout and stderr, of every generation and node, as the agents sent them to the controller
(which keeps a job's newest ~10,000 lines): one ``[gen 2 rank 0 node-1] <line>`` each, or one JSON object a
line with ``--json``. Control characters in a line are shown escaped (``\\x1b``), never sent to the terminal, and so
are characters that reorder or hide text (bidi overrides and isolates, zero-width ones: ``\\u202e``).
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from controller.client.commands.common import add_client_arguments, call, number
from morphing.validation import STORABLE_INT

UINT32 = 2**32 - 1
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")  # C0 and C1 controls but the tab
# Characters that reorder or hide text on a terminal: bidi embeddings, overrides, isolates and marks, and the
# zero-width ones (a line can then read as something it is not: Trojan Source, CVE-2021-42574).
INVISIBLE = re.compile("[\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", help="job id, e.g. job-1")
    parser.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new lines (ends once the job ended and went quiet)"
    )
    parser.add_argument("--rank", metavar="R", help="only this rank's lines (0 or more)")
    parser.add_argument("--generation", metavar="G", help="only this generation's lines (1 or more)")
    parser.add_argument("--after", metavar="ID", help="only lines after this one (an id from --json), e.g. to resume")
    add_client_arguments(parser)


def shown(text: str) -> str:
    """A line as a terminal may print it: control, bidi and zero-width characters escaped."""
    text = CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)
    return INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def line_dict(line: Any) -> dict[str, Any]:
    """The ``--json`` shape of one line (a contract for scripts)."""
    return {
        "id": line.id,
        "generation": line.generation,
        "rank": line.rank,
        "node": line.node,
        "at": line.at,
        "text": line.text,
    }


def run(args: argparse.Namespace) -> int:
    from protos.spotmorph.v1 import controller_pb2 as pb
    from protos.spotmorph.v1 import controller_pb2_grpc as rpc

    rank = number(
        "--rank", args.rank, 0, UINT32, "give a rank number, 0 or more (`spotmorph status JOB` shows the layout)"
    )
    generation = number(
        "--generation", args.generation, 1, STORABLE_INT, "give a generation number, 1 or more (`spotmorph status JOB`)"
    )
    fix = "give a line id from `spotmorph logs JOB --json`, 0 or more"
    after = number("--after", args.after, 0, STORABLE_INT, fix) or 0
    request = pb.WatchLogsRequest(job=args.job, after=after, follow=args.follow)
    if rank is not None:
        request.rank = rank
    if generation is not None:
        request.generation = generation

    def stream(channel: Any) -> int:
        for line in rpc.JobsStub(channel).WatchLogs(request):
            if args.json:
                print(json.dumps(line_dict(line)), flush=True)
            else:
                print(f"[gen {line.generation} rank {line.rank} {line.node}] {shown(line.text)}", flush=True)
        return 0

    _, code = call(args, stream)  # `spotmorph logs JOB | head`: spotmorph.cli.main ends a closed pipe quietly
    return code
