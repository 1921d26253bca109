"""A list of controller addresses, ``HOST:PORT[,HOST:PORT...]``: one leads, the others stand by.

The CLI (``--controller``, SPOTMORPH_CONTROLLER, the context file) and the agent (``--controller``) read the
list with this one parser, so both accept the same entries and word a bad one the same way: ``HOST:PORT``,
``[IPv6]:PORT``, and gRPC's own target names (``unix:PATH``, ``unix-abstract:NAME``, ``dns:///HOST:PORT``), which
both pass to a gRPC channel as they are. Each entry is checked before any connection: a typo (a missing
port, an empty entry from a stray comma) would otherwise surface as gRPC's "name resolution failed" or a wait
for an address that can never answer. It lives beside the generated stubs, as :mod:`protos.reasons` does,
because the controller's client and the agent both depend on them and on nothing else of each other.
"""

from __future__ import annotations

import re

from morphing.errors import UserInputError

EXAMPLE_PORT = 50051  # the controller's default port, for the fix a message suggests
EXAMPLE = f"10.0.0.4:{EXAMPLE_PORT},10.0.0.5:{EXAMPLE_PORT}"
# gRPC's own target names, taken as they are (one address each): a Unix socket, a DNS name resolved by gRPC.
TARGET_SCHEMES = ("unix:", "unix-abstract:", "dns:")
SEVERAL = "HOST:PORT,HOST:PORT"
SEPARATORS = ";|"  # what a list separated by something other than commas has in it
_NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # a host name or an IPv4 address
_BRACKETED = re.compile(r"^\[[0-9A-Fa-f:.]+(%[A-Za-z0-9._-]+)?\]$")  # an IPv6 address, with its zone if any
_IPV6 = re.compile(r"^[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*$")  # an IPv6 address someone forgot to put in brackets


def parse_addresses(text: str, source: str) -> tuple[str, ...]:
    """The addresses ``text`` lists, in order, each once; a UserInputError naming the bad entry, its position and
    the fix (``source`` says where the text came from: ``--controller``, ``SPOTMORPH_CONTROLLER``, a file)."""
    addresses: list[str] = []
    entries = text.split(",")
    for number, raw in enumerate(entries, start=1):
        entry = raw.strip()
        where = f"entry {number} of {len(entries)}" if len(entries) > 1 else ""
        problem = _problem(entry, where)
        if problem:
            raise UserInputError(f"{source} {text!r}: {problem}")
        if entry not in addresses:
            addresses.append(entry)
    return tuple(addresses)


def _problem(entry: str, where: str) -> str:
    """What is wrong with one entry, and its fix ('' when nothing is); ``where``: its position in a list of
    several ('' when it is the only one, which the message's prefix names already)."""
    if not entry:
        return f"{where or 'the address'} is empty; give HOST:PORT, or several as {SEVERAL} with no empty entries"
    named = f"{where} ({entry!r})" if where else "the address"
    if entry.startswith(TARGET_SCHEMES):
        if entry.partition(":")[2].strip("/"):
            return ""
        return f"{named} names no target; write e.g. unix:///run/spotmorph.sock or dns:///ctl:{EXAMPLE_PORT}"
    odd = next((c for c in entry if c.isspace() or c in SEPARATORS), "")
    if odd:
        what = "a space" if odd.isspace() else repr(odd)
        return f"{named} has {what} in it; separate controllers with commas and no spaces, e.g. {EXAMPLE}"
    host, colon, port = entry.rpartition(":")
    if not colon:
        return f"{named} has no port; write it as {entry}:PORT, e.g. {entry}:{EXAMPLE_PORT}"
    if not host:
        return f"{named} has no host; write it as HOST:{port}, e.g. 127.0.0.1:{port}"
    if _IPV6.match(host):
        return f"{named} has the IPv6 address {host!r} without brackets; write it in brackets, e.g. [{host}]:{port}"
    if not (_NAME.match(host) or _BRACKETED.match(host)):
        return f"{named} has {host!r}, which is not a host name or an IP address; write it as HOST:PORT"
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"{named} has a bad port {port!r}; give a port from 1 to 65535, e.g. {host}:{EXAMPLE_PORT}"
    return ""
