"""Paging of ListJobs and ListNodes: a bounded page and an opaque token that says where the next begins.

Without it a reply carried every job ever submitted and hit the gRPC message cap near 70,000 jobs.
The token is base64url JSON naming the list and a position: for jobs, how many came before (jobs
are never deleted and keep their submission order); for nodes, the (joined_at, name) the page ended
at (nodes are listed in that order, and forgotten ones leave no gap to skip). Tokens from outside are
hostile: anything that does not decode to a position of the same list is INVALID_ARGUMENT.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from morphing.validation import InvalidField

DEFAULT_PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000
MAX_TOKEN_LENGTH = 512
T = TypeVar("T")
NodeKey = tuple[float, str]


def page_size(requested: int) -> int:
    """The page size a request asks for (0: the default); more than :data:`MAX_PAGE_SIZE` is refused."""
    if requested > MAX_PAGE_SIZE:
        raise InvalidField("page_size", f"{requested} is more than {MAX_PAGE_SIZE}; ask for fewer and follow the token")
    return requested or DEFAULT_PAGE_SIZE


def encode(kind: str, position: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps([kind, *position]).encode()).decode()


def decode(kind: str, token: str) -> list[Any]:
    """The position in ``token``; InvalidField unless it is one of a ``kind`` list."""
    refused = InvalidField("page_token", f"not a page token of {kind}; pass the next_page_token of the last reply")
    if len(token) > MAX_TOKEN_LENGTH:
        raise refused
    try:
        data = json.loads(base64.urlsafe_b64decode(token.encode("ascii")))
    except (UnicodeError, binascii.Error, ValueError):
        raise refused from None
    if not isinstance(data, list) or not data or data[0] != kind:
        raise refused
    return data[1:]


def page_of_jobs(jobs: Sequence[T], size: int, token: str) -> tuple[Sequence[T], str]:
    """Jobs after the token's count, and the token of the next page ("" after the last)."""
    start = 0
    if token:
        position = decode("jobs", token)
        if len(position) != 1 or type(position[0]) is not int or position[0] < 0:
            raise InvalidField("page_token", "not a page token of jobs; pass the next_page_token of the last reply")
        start = position[0]
    end = start + size
    return jobs[start:end], encode("jobs", [end]) if end < len(jobs) else ""


def page_of_nodes(nodes: Sequence[T], key: Callable[[T], NodeKey], size: int, token: str) -> tuple[Sequence[T], str]:
    """Nodes (sorted by ``key``) after the token's key, and the token of the next page ("" after the last)."""
    start = 0
    if token:
        after = _node_key(decode("nodes", token))
        start = bisect.bisect_right([key(n) for n in nodes], after)
    chosen = nodes[start : start + size]
    more = start + size < len(nodes)
    return chosen, encode("nodes", list(key(chosen[-1]))) if more and chosen else ""


def _node_key(position: list[Any]) -> NodeKey:
    if len(position) == 2:
        joined_at, name = position
        if type(joined_at) in (int, float) and math.isfinite(joined_at) and isinstance(name, str):
            return float(joined_at), name
    raise InvalidField("page_token", "not a page token of nodes; pass the next_page_token of the last reply")
