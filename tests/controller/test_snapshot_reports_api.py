"""The controller refuses peer snapshot steps a held rank could not hold, naming the field."""

from __future__ import annotations

from protos.spotmorph.v1 import controller_pb2 as pb
from tests.controller.conftest import Live
from tests.controller.test_hostile_edge import INVALID, refusal, running_job


def test_snapshot_steps_past_the_held_step_or_without_one_are_refused(live: Live) -> None:
    node, job_id, generation = running_job(live, steps=100)

    def status(**fields: object) -> pb.TrainerStatus:
        return pb.TrainerStatus(job=job_id, generation=generation, rank=0, running=True, last_step=10, **fields)  # type: ignore[arg-type]

    code, detail = refusal(lambda: node.beat(status(held_step=10, snapshot_received_steps=[11])))
    assert code == INVALID and "trainers[0].snapshot_received_steps" in detail, detail
    code, detail = refusal(lambda: node.beat(status(snapshot_own_steps=[9])))
    assert code == INVALID and "trainers[0].snapshot_own_steps" in detail and "held_step" in detail, detail
    code, detail = refusal(lambda: node.beat(status(held_step=10, snapshot_own_steps=[1, 2, 3, 4, 5])))
    assert code == INVALID and "at most 4 steps" in detail, detail
