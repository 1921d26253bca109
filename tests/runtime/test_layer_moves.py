"""What a moved layer is on the wire: a JSON description and the tensors' own bytes (the process side of a move
runs in test_held.py with real gloo processes)."""

from __future__ import annotations

import json

import pytest
import torch

from worker_agent.runtime.morph.layer_moves import TENSOR, allocate, as_bytes, describe, digest


def payload() -> dict[str, object]:
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return {
        "format": "spotmorph.layer/v1",
        "layer": "l0",
        "tensors": {"l0.w": weight, "l0.b": torch.ones(4, dtype=torch.bfloat16), "l0.e": torch.empty(0, 5)},
        "optimizer": {"l0.w": {"step": torch.tensor(7.0), "exp_avg": weight * 0.5, "lr": 1e-3, "flag": None}},
    }


def test_a_description_travels_as_json_and_allocates_the_same_tensors_to_receive_into() -> None:
    sent: list[torch.Tensor] = []
    text = json.dumps(describe(payload(), sent))
    received: list[torch.Tensor] = []
    shape = allocate(json.loads(text), received)
    assert [(t.dtype, t.shape) for t in received] == [(t.dtype, t.shape) for t in sent]
    for into, data in zip(received, sent, strict=True):
        if data.numel():
            as_bytes(into).copy_(as_bytes(data))  # what irecv does
    assert shape["optimizer"]["l0.w"]["lr"] == 1e-3 and shape["optimizer"]["l0.w"]["flag"] is None
    assert torch.equal(shape["tensors"]["l0.w"], payload()["tensors"]["l0.w"])  # type: ignore[index]
    assert torch.equal(shape["tensors"]["l0.b"], torch.ones(4, dtype=torch.bfloat16))
    assert digest(received) == digest(sent)
    as_bytes(received[0])[5] ^= 1  # one bit
    assert digest(received) != digest(sent)


@pytest.mark.parametrize(
    "description",
    [
        {TENSOR: 0, "dtype": "no_such_dtype", "shape": [2]},
        {TENSOR: 0, "dtype": "float32", "shape": [-1]},
        {TENSOR: 0, "dtype": "float32", "shape": [2.5]},
        {TENSOR: 0, "dtype": "Tensor", "shape": [2]},
    ],
)
def test_a_description_naming_no_tensor_is_refused(description: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="described a tensor"):
        allocate({"tensors": {"w": description}}, [])


def test_what_is_not_a_tensor_number_or_text_is_not_sent() -> None:
    with pytest.raises(TypeError, match="set"):
        describe({"odd": {1, 2}}, [])
