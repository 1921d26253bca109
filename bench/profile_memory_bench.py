"""What ``spotmorph profile`` holds in memory, chained and ``--from-config``, for Llama-shaped models.

Models (Hugging Face ``LlamaForCausalLM`` from a config, nothing downloaded; byte tokens of
examples/data in 32-token sequences, a 32,000-token vocabulary as Llama's): ``build_0p5b`` is 8 layers of
width 2048 (about 0.54B parameters, 2.1 GB in float32), ``build_7b_shape`` 8 layers of Llama-2-7B's width
4096 and MLP 11008 (about 1.9B parameters, 7.6 GB; with its gradients and Adam's two moments 30 GB, more
than this machine's 24 GiB). Each profile runs in its own process (micro-batch size 1, 2 repeats, no
network figures); measured: its peak resident memory (the child's ``ru_maxrss``) and wall time. The chained
profile of the 7B-shaped model is not run (it cannot fit). ``python -m bench.profile_memory_bench`` puts the
table in docs/benchmarks.md; ``--quick`` runs the 0.5B model only and prints.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, machine, replace_section

HEADING = "## Profiles of models larger than the device (`spotmorph profile --from-config`)"
SEQ_LEN = 32
SHAPES = {"0p5b": (2048, 8, 5504, 16), "7b_shape": (4096, 8, 11008, 32)}  # width, layers, MLP, heads
MEMORY = ("parameter_bytes", "activation_memory_bytes_per_sample", "output_activation_bytes_per_sample")


def _build(shape: str):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig, LlamaForCausalLM

    from spotmorph.data import TokenFileDataset
    from spotmorph.hf import causal_lm_spec

    width, layers, mlp, heads = SHAPES[shape]
    train = TokenFileDataset(ROOT / "examples" / "data" / "lighthouse.bin", seq_len=SEQ_LEN)
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=width,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=SEQ_LEN,
    )
    return causal_lm_spec(LlamaForCausalLM(config), train)


def build_0p5b():  # type: ignore[no-untyped-def]
    return _build("0p5b")


def build_7b_shape():  # type: ignore[no-untyped-def]
    return _build("7b_shape")


_CHILD = (
    "import resource, subprocess, sys, time; t = time.perf_counter(); "
    "code = subprocess.run(sys.argv[1:]).returncode; "
    "print(code, time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)"
)


def profile(shape: str, from_config: bool, out: Path) -> tuple[float, int, dict[str, object]]:
    """Wall seconds, peak resident bytes and the profile of one ``spotmorph profile`` process."""
    command = [sys.executable, "-m", "spotmorph.cli", "profile", f"{__file__}:build_{shape}"]
    command += ["--micro-batch-sizes=1", "--repeats=2", "--no-network", f"--out={out}"]
    command += ["--from-config"] if from_config else []
    done = subprocess.run([sys.executable, "-c", _CHILD, *command], capture_output=True, text=True, cwd=ROOT)
    code, seconds, peak = done.stdout.split()[-3:]
    if code != "0":
        raise SystemExit(f"profile of {shape} failed:\n{done.stderr[-3000:]}")
    return float(seconds), int(peak), json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the 0.5B model only; print, write nothing")
    args = parser.parse_args()
    runs = [("0p5b", False), ("0p5b", True)] + ([] if args.quick else [("7b_shape", True)])
    rows, profiles = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape, from_config in runs:
            seconds, peak, result = profile(shape, from_config, Path(tmp) / f"{shape}-{from_config}.json")
            profiles[(shape, from_config)] = result
            layers = result["layers"]
            assert isinstance(layers, list)
            weights = sum(layer["parameter_bytes"] for layer in layers)
            mode = "--from-config" if from_config else "chained"
            figures = f"{weights / 1e9:.2f} | {peak / 1e9:.2f} | {peak / weights:.2f} | {seconds:.0f}"
            rows.append(f"| {shape} | {mode} | {figures} |")
            print(rows[-1], flush=True)
    chained, alone = profiles[("0p5b", False)]["layers"], profiles[("0p5b", True)]["layers"]
    assert isinstance(chained, list) and isinstance(alone, list)
    same = all({k: a[k] for k in MEMORY} == {k: c[k] for k in MEMORY} for a, c in zip(alone, chained, strict=True))
    print(f"memory figures of the two 0.5B profiles equal: {same}")
    if args.quick:
        return
    section = "\n".join(
        [
            HEADING,
            "",
            f"Command: `python -m bench.profile_memory_bench`. {machine()}. {__doc__.split(chr(10) + chr(10))[1]}",
            "",
            "| model | profile | parameters (GB, tied per layer) | peak RSS (GB) | peak / parameters | seconds |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"The two 0.5B profiles' memory figures (parameter, held-activation and output bytes of every layer) are "
            f"equal: {same}. Times are one core's, the machine shared.",
        ]
    )
    replace_section(HEADING, section)


if __name__ == "__main__":
    main()
