"""Writes gpt48.json: an analytic calibration profile of a GPT-style model on AWS p3 (V100) nodes.

The model: 48 transformer blocks, hidden 3072, 24 heads, sequence 1024, vocabulary 50,257, an
embedding layer and an output head (tied to the embedding in the model, a copy on the last stage);
about 5.6 B parameters, trained in mixed precision (fp16 weights and gradients, fp32 Adam state) with
activation recomputation per block (as Varuna and Megatron do at this size).

Where the figures come from:
- FLOPs per sample (Narayanan et al., SC'21): a block's forward is 24 s h^2 + 4 s^2 h, the head's
  2 s h V; a backward with recomputation costs 3x the forward (one forward again, then 2x).
- Speed: V100 fp16 tensor peak 125 TFLOP/s at an achieved fraction that grows with the micro-batch
  size, 0.45 m / (m + 0.5) (30% at m = 1, 42% at m = 8: typical of Megatron-LM on V100).
- The embedding lookup and the loss are memory-bound: bytes moved / 900 GB/s HBM2.
- Memory: 2 bytes per parameter for weights, 2 for gradients, 12 for fp32 master weights and Adam
  moments (so 1.0 and 6.0 per parameter byte); recomputation keeps each block's input (2 s h bytes
  per sample); the head holds fp32 logits (4 s V bytes per sample).
- Network: p3.16xlarge: NVLink within a node (~100 GB/s usable), 25 Gbit/s between nodes
  (3.1 GB/s, 2.5 GB/s ring all-reduce bus bandwidth); 15 GiB of the 16 GiB usable per GPU.
Run it again to regenerate the JSON: ``python examples/profiles/gpt48_profile.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

BLOCKS, HIDDEN, SEQ, VOCAB = 48, 3072, 1024, 50257
PEAK_FLOPS, HBM_BYTES_PER_SECOND = 125e12, 900e9
MICRO_BATCH_SIZES = (1, 2, 4, 8)


def efficiency(m: int) -> float:
    return 0.45 * m / (m + 0.5)


def compute_seconds(flops_per_sample: float, m: int) -> float:
    return m * flops_per_sample / (PEAK_FLOPS * efficiency(m))


def layer(name: str, fwd: dict[int, float], params: int, out_bytes: int, act_bytes: int) -> dict[str, object]:
    return {
        "name": name,
        "forward_seconds": {str(m): round(t, 9) for m, t in fwd.items()},
        "backward_seconds": {str(m): round(3 * t, 9) for m, t in fwd.items()},
        "output_activation_bytes_per_sample": out_bytes,
        "parameter_bytes": params,
        "activation_memory_bytes_per_sample": act_bytes,
    }


def build() -> dict[str, object]:
    boundary = 2 * SEQ * HIDDEN
    block_flops = 24 * SEQ * HIDDEN**2 + 4 * SEQ**2 * HIDDEN
    head_flops = 2 * SEQ * HIDDEN * VOCAB
    embed_seconds = 3 * SEQ * HIDDEN * 2 / HBM_BYTES_PER_SECOND
    loss_seconds = 3 * SEQ * VOCAB * 4 / HBM_BYTES_PER_SECOND
    layers = [
        layer(
            "embed",
            {m: m * embed_seconds for m in MICRO_BATCH_SIZES},
            2 * (VOCAB + SEQ) * HIDDEN,
            boundary,
            boundary,
        ),
        *(
            layer(
                f"block.{i}",
                {m: compute_seconds(block_flops, m) for m in MICRO_BATCH_SIZES},
                2 * (12 * HIDDEN**2 + 13 * HIDDEN),
                boundary,
                boundary,
            )
            for i in range(BLOCKS)
        ),
        layer(
            "head",
            {m: compute_seconds(head_flops, m) + m * loss_seconds for m in MICRO_BATCH_SIZES},
            2 * (VOCAB * HIDDEN + 2 * HIDDEN),
            4,
            4 * SEQ * VOCAB + boundary,
        ),
    ]
    return {
        "format": "spotmorph.profile/v1",
        "model": "gpt48-5.6b",
        "source": "analytic, not measured: see examples/profiles/gpt48_profile.py for the formulas "
        "(Megatron FLOP counts, V100 fp16 at 30-42% of peak, recomputation, p3.16xlarge network)",
        "dtype": "float16",
        "gradient_bytes_per_parameter_byte": 1.0,
        "optimizer_bytes_per_parameter_byte": 6.0,
        "layers": layers,
        "cluster": {
            "gpu_memory_bytes": 15 * 1024**3,
            "intra_node_bandwidth_bytes_per_second": 100e9,
            "inter_node_bandwidth_bytes_per_second": 3.125e9,
            "allreduce_bandwidth_bytes_per_second": 2.5e9,
            "intra_node_latency_seconds": 1e-5,
            "inter_node_latency_seconds": 3e-5,
        },
    }


if __name__ == "__main__":
    out = Path(__file__).with_name("gpt48.json")
    out.write_text(json.dumps(build(), indent=2) + "\n")
    print(f"wrote {out}")
