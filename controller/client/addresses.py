"""A list of controller addresses, ``HOST:PORT[,HOST:PORT...]``: one leads, the others are standbys.

Each entry is checked here, before any connection: a typo (a missing port, an empty entry from a stray comma)
would otherwise surface as gRPC's "name resolution failed" or a wait for an address that can never answer.
"""

from __future__ import annotations

from morphing.errors import UserInputError

EXAMPLE_PORT = 50051  # the controller's default port, for the fix a message suggests
IPV6_CHARACTERS = frozenset("0123456789abcdefABCDEF:.")
SHAPE = "HOST:PORT, or several controllers as HOST:PORT,HOST:PORT"


def parse_addresses(text: str, source: str) -> tuple[str, ...]:
    """The addresses ``text`` lists, in order, without repeats; a UserInputError naming the bad entry and the fix
    (``source`` says where the text came from: ``--controller``, ``SPOTMORPH_CONTROLLER``, a file)."""
    addresses: list[str] = []
    entries = text.split(",")
    for number, raw in enumerate(entries, start=1):
        entry = raw.strip()
        problem = _problem(entry, number, len(entries))
        if problem:
            raise UserInputError(f"{source} {text!r}: {problem}")
        if entry not in addresses:
            addresses.append(entry)
    return tuple(addresses)


def _problem(entry: str, number: int, count: int) -> str:
    """What is wrong with one entry, and its fix ('' when nothing is)."""
    if not entry:
        where = f"entry {number} of {count}" if count > 1 else "the address"
        return f"{where} is empty; give {SHAPE}, with no empty entries"
    if any(c in entry for c in " \t;|"):
        return f"entry {entry!r}: separate controllers with commas, e.g. a:{EXAMPLE_PORT},b:{EXAMPLE_PORT}"
    host, colon, port = entry.rpartition(":")
    if not colon:
        return f"entry {entry!r} has no port; give it as {entry}:PORT, e.g. {entry}:{EXAMPLE_PORT}"
    if not host:
        return f"entry {entry!r} has no host; give it as HOST:{port}, e.g. 127.0.0.1:{port}"
    bracketed = host.startswith("[") and host.endswith("]")
    if ":" in host and not bracketed and all(c in IPV6_CHARACTERS for c in host):
        return f"entry {entry!r}: write an IPv6 address in brackets, e.g. [{host}]:{port}"
    if not bracketed and not all(c.isascii() and (c.isalnum() or c in ".-_") for c in host):
        return f"entry {entry!r}: {host!r} is not a host name or an IP address; give HOST:PORT"
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"entry {entry!r} has a bad port {port!r}; give a port from 1 to 65535, e.g. {host}:{EXAMPLE_PORT}"
    return ""


def listed(addresses: tuple[str, ...] | list[str]) -> str:
    """``a:1, b:2``: addresses as one message names them."""
    return ", ".join(addresses)
