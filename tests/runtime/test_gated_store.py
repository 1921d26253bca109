"""The rendezvous store admits only the ranks that hold the generation's key (issue 44, finding 3).

Real sockets and real gloo groups: ranks that prove the key meet and all-reduce; a client without it, a raw
connection that skips the handshake and a process that took the port pretending to be the store get nothing
and change nothing; the store binds exactly the address it is given, never a wildcard; and a `spotmorph train`
run listens on no wildcard address while it trains, its key in a file only its user reads.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.runtime.helpers import REPO, TINY
from worker_agent.runtime.link.gated_store import (
    MAGIC,
    MAX_FRAME_BYTES,
    SET,
    GatedStore,
    PortTaken,
    StoreAuthFailed,
    StoreServer,
    bind,
)

KEY = os.urandom(32)
WAIT = datetime.timedelta(seconds=20)


@pytest.fixture
def server() -> Iterator[StoreServer]:
    served = StoreServer("127.0.0.1", 0, KEY)
    yield served
    served.close()


def test_ranks_with_the_key_meet_and_all_reduce(server: StoreServer) -> None:
    sums: dict[int, list[float]] = {}

    def rank(r: int) -> None:
        client = GatedStore(*server.address, KEY, WAIT)  # kept: torch holds only the C++ half
        group = dist.ProcessGroupGloo(dist.PrefixStore("gen-1/", client), r, 3, WAIT)  # type: ignore[attr-defined]
        tensor = torch.full((2,), float(r + 1))
        group.allreduce([tensor]).wait()  # type: ignore[attr-defined]
        sums[r] = tensor.tolist()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sums == {r: [6.0, 6.0] for r in range(3)}


def test_the_stores_operations_keep_torchs_meaning(server: StoreServer) -> None:
    store = GatedStore(*server.address, KEY, WAIT)
    assert store.add("n", 2) == 2 and store.add("n", 3) == 5 and store.get("n") == b"5"
    store.set("k", b"\x00\xffbinary")
    assert store.get("k") == b"\x00\xffbinary" and store.check(["k", "n"]) and not store.check(["k", "none"])
    assert store.compare_set("c", b"", b"first") == b"first"  # absent and expected empty: set
    assert store.compare_set("c", b"other", b"second") == b"first"  # not as expected: the current value
    assert store.compare_set("c", b"first", b"second") == b"second"
    assert store.num_keys() == 3 and store.delete_key("c") and not store.delete_key("c")
    with pytest.raises(dist.DistStoreError, match="timed out"):
        store.wait(["never"], datetime.timedelta(milliseconds=100))
    twin = store.clone()
    twin.set("from twin", b"1")
    assert store.get("from twin") == b"1"


def test_a_client_without_the_key_gets_nothing_and_changes_nothing(server: StoreServer) -> None:
    GatedStore(*server.address, KEY, WAIT).set("secret", b"value")
    intruder = GatedStore(*server.address, os.urandom(32), WAIT)
    for attempt in (lambda: intruder.get("secret"), lambda: intruder.set("secret", b"evil")):
        with pytest.raises(StoreAuthFailed, match="refused this generation's key"):
            attempt()
    # A raw connection that skips the handshake and sends a request: closed, nothing stored.
    with socket.create_connection(server.address, timeout=10) as raw:
        assert raw.recv(len(MAGIC)) == MAGIC
        body = bytes([SET]) + b"".join(struct.pack(">I", len(p)) + p for p in (b"secret", b"evil"))
        raw.sendall(struct.pack(">I", len(body)) + body + b"\x00" * 64)
        raw.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            while raw.recv(4096):
                pass  # the server closes it
    assert server.table.data == {"secret": b"value"}


def test_a_process_that_took_the_port_cannot_pass_for_the_store() -> None:
    """It answers the handshake as the store would, but cannot prove the key: the rank refuses it."""
    impostor = bind("127.0.0.1", 0)
    port = impostor.getsockname()[1]

    def pretend() -> None:
        conn, _ = impostor.accept()
        conn.sendall(MAGIC + os.urandom(32))
        conn.recv(64)
        conn.sendall(os.urandom(32))
        conn.close()

    threading.Thread(target=pretend, daemon=True).start()
    with pytest.raises(StoreAuthFailed, match="did not prove this generation's key"):
        GatedStore("127.0.0.1", port, KEY, WAIT).set("k", b"v")
    impostor.close()


def test_the_store_binds_exactly_its_address_and_a_taken_port_is_said_so(server: StoreServer) -> None:
    assert server._listener.getsockname()[0] == "127.0.0.1"
    for wildcard in ("", "0.0.0.0", "::"):
        with pytest.raises(ValueError, match="node's own address"):
            StoreServer(wildcard, 0, KEY)
    with pytest.raises(PortTaken, match=f"127.0.0.1:{server.address[1]} is taken on this node"):
        StoreServer("127.0.0.1", server.address[1], KEY)


def test_an_oversized_frame_ends_the_connection_and_a_full_store_refuses_more(server: StoreServer) -> None:
    store = GatedStore(*server.address, KEY, WAIT)
    conn = store._connection()
    conn.sendall(struct.pack(">I", MAX_FRAME_BYTES + 1))
    conn.settimeout(10)
    assert conn.recv(1) == b""  # closed
    store._local.conn = None
    big = b"x" * (MAX_FRAME_BYTES - 64)
    with pytest.raises(dist.DistStoreError, match="refused a request"):
        for i in range(100):  # 64 MiB at most in all
            store.set(f"big-{i}", big)
    assert server.table.size <= 64 << 20


WILDCARDS = frozenset({"00000000", "00000000000000000000000000000000"})  # 0.0.0.0 and :: as /proc/net shows them


def listening_addresses(pids: set[int]) -> set[str]:
    """The local addresses the processes ``pids`` listen on (TCP), from /proc."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.add(fields[1].rsplit(":", 1)[0])
    return found


def tree(root: int) -> set[int]:
    pids, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            pids.add(child)
            frontier.append(child)
    return pids


@pytest.mark.slow
def test_a_training_run_listens_on_no_wildcard_address_and_keeps_its_key_private(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "spotmorph.cli", "train", TINY, "--stages=2", "--replicas=1", "--steps=100000",
        "--global-batch=7", "--micro-batch-size=2", "--device=cpu", "--checkpoint-interval=0",
        f"--checkpoint-dir={tmp_path / 'ckpt'}", f"--run-dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while (
            not list(run_dir.glob("progress-rank-1.jsonl"))
            or "step" not in (run_dir / "progress-rank-1.jsonl").read_text()
        ):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.2)
        addresses = listening_addresses(tree(proc.pid))
        assert addresses, "the run's store and gloo listen somewhere"
        assert not addresses & WILDCARDS, addresses
        key = run_dir / "rendezvous.key"
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_text()) == 64
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.mark.slow
def test_a_host_rank_whose_port_is_taken_says_so_and_is_no_failed_trainer(tmp_path: Path) -> None:
    """Exit 2 with the trainer's word ``port_taken``: the controller starts the generation on another port
    without counting a restart (tests/controller/test_refusals.py)."""
    from morphing.jobspec import JobSpec
    from morphing.layout import make_layout
    from worker_agent.contract import GenerationDir, TrainerArguments, TrainerFailed, events_of, read_progress

    directory = GenerationDir(tmp_path / "gen-1")
    directory.path.mkdir()
    job = JobSpec(name="t", entrypoint=TINY, global_batch=4, steps=2, checkpoint_dir=str(tmp_path / "c"))
    directory.job_file.write_text(job.model_dump_json())
    layout = make_layout(num_layers=4, pipeline_stages=1, data_parallel=1, micro_batch_size=2, global_batch=4)
    directory.layout_file.write_text(json.dumps(layout.to_dict()))
    directory.write_rendezvous_key(KEY.hex())
    squatter = bind("127.0.0.1", 0)  # another process holds the generation's port
    port = squatter.getsockname()[1]
    args = TrainerArguments.in_generation_dir(directory, 0, f"127.0.0.1:{port}", tmp_path / "c", host_store=True)
    result = subprocess.run(args.command(sys.executable), capture_output=True, text=True, timeout=120, cwd=REPO)
    squatter.close()
    assert result.returncode == 2, result.stderr
    [failed] = events_of(read_progress(directory.progress_file(0)), TrainerFailed)
    assert failed.kind == "port_taken" and f"127.0.0.1:{port} is taken on this node" in failed.message
