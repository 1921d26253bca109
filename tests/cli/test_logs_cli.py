"""`spotmorph logs JOB`: each trainer line as ``[gen G rank R NODE] text`` (or JSON lines), filtered by rank and
generation; bad input exits 2 with one line naming the problem and the fix, an unknown job exits 3."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protos.spotmorph.v1 import controller_pb2 as pb
from spotmorph.cli import main
from tests.controller.conftest import running
from tests.controller.test_hostile_edge import running_job


def logs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["logs", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--rank", "-1"], "--rank '-1': give a rank number, 0 or more"),
        (["--rank", "one"], "--rank 'one'"),
        (["--rank", str(2**32)], "--rank"),
        (["--generation", "0"], "--generation '0': give a generation number, 1 or more"),
        (["--generation", "2.5"], "--generation '2.5'"),
        (["--after", "-3"], "--after '-3'"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag_and_the_fix(
    capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    # an address nothing listens on: a flag that got past the checks would fail differently (exit 5)
    code, out, err = logs(capsys, "job-1", *flags, "--controller", "127.0.0.1:9", "--token", "t")
    assert code == 2 and out == "", err
    assert named in err and len(err.strip().splitlines()) == 1, err


def test_lines_of_every_rank_printed_filtered_and_as_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with running(tmp_path) as live:
        node, job, generation = running_job(live)
        ranks = list(node.beat().assignment.ranks)
        chunks = [
            pb.LogChunk(
                job=job,
                generation=generation,
                rank=r,
                text=f"rank {r} ready\n\x1b[31mred\x1b[0m \u202eevil\u2066\u200b\n".encode(),
            )
            for r in ranks
        ]
        node.stub.ReportLogs(pb.ReportLogsRequest(node_name=node.name, incarnation=node.incarnation, chunks=chunks))
        where = ["--controller", live.address, "--token", live.token("reader")]

        code, out, err = logs(capsys, job, *where)
        assert code == 0, err
        # Escaped: a line's control characters, bidi overrides and isolates and zero-width characters never reach
        # the terminal (they could make a line read as another: Trojan Source).
        red = "\\x1b[31mred\\x1b[0m \\u202eevil\\u2066\\u200b"
        expected = [f"[gen {generation} rank {r} {node.name}] {t}" for r in ranks for t in (f"rank {r} ready", red)]
        assert out.splitlines() == expected
        assert not {"\x1b", "\u202e", "\u2066", "\u200b"} & set(out)

        code, out, _ = logs(capsys, job, "--rank", str(ranks[-1]), "--generation", str(generation), *where)
        assert (
            code == 0
            and out.splitlines()[0] == f"[gen {generation} rank {ranks[-1]} {node.name}] rank {ranks[-1]} ready"
        )
        assert len(out.splitlines()) == 2

        code, out, _ = logs(capsys, job, "--json", *where)
        rows = [json.loads(line) for line in out.splitlines()]
        assert code == 0 and [r["text"] for r in rows[:2]] == [
            f"rank {ranks[0]} ready",
            "\x1b[31mred\x1b[0m \u202eevil\u2066\u200b",
        ]
        assert set(rows[0]) == {"id", "generation", "rank", "node", "at", "text"}
        assert rows[0]["node"] == node.name and rows[0]["generation"] == generation
        code, out, _ = logs(capsys, job, "--json", "--after", str(rows[0]["id"]), *where)
        assert [json.loads(line)["id"] for line in out.splitlines()] == [r["id"] for r in rows[1:]]

        code, out, err = logs(capsys, "job-404", *where)
        assert code == 3 and out == "" and "NOT_FOUND" in err and len(err.strip().splitlines()) == 1
        code, out, err = logs(capsys, job, "--generation", str(generation + 5), *where)
        assert code == 2 and "generation" in err and len(err.strip().splitlines()) == 1
