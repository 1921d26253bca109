"""What ``spotmorph status`` says of a job's peer snapshots: the stages they protect, or that too few nodes leave
a stage unprotected, through GetJob's ``snapshots`` (morphing.snapshots.protection)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.api import wire
from controller.client.commands.common import job_dict
from morphing.layout import Layout, Slot, even_partition
from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.helpers import job, spec


def pipeline(nodes: list[str]) -> Layout:
    return Layout(len(nodes), 1, 1, 8, even_partition(6, len(nodes)), tuple(Slot(n, i) for i, n in enumerate(nodes)))


def said(layout: Layout | None, **fields: object) -> str:
    record = replace(job("j1"), layout=layout, spec=spec(**fields))
    return str(job_dict(pb.Job.FromString(wire.job_to_pb(record).SerializeToString()))["snapshots"])


def test_a_pipeline_on_one_node_says_too_few_nodes_in_status() -> None:
    words = said(pipeline(["a", "a", "a"]))
    assert words.startswith("peer snapshots cannot protect this layout: too few nodes") and "checkpoint" in words


def test_a_pipeline_on_three_nodes_says_which_stages_its_snapshots_protect() -> None:
    assert said(pipeline(["a", "b", "c"])).startswith("peer snapshots protect stage(s) 0, 1, 2")


@pytest.mark.parametrize(
    ("layout", "fields"),
    [
        (None, {}),
        (pipeline(["a", "b"]), {"snapshot_interval": 0}),
        (pipeline(["a", "b"]), {"morph_through_memory": False}),
        (Layout(1, 2, 1, 8, even_partition(6, 1), (Slot("a", 0), Slot("b", 0))), {}),
    ],
)
def test_no_layout_snapshots_off_or_every_stage_on_two_nodes_says_nothing(
    layout: Layout | None, fields: dict[str, object]
) -> None:
    assert said(layout, **fields) == ""
