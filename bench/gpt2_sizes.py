"""GPT-2 models of a few sizes for the memory-morph benchmark, built from a config (nothing downloaded).

Like examples/hf_gpt2.py (byte-level tokens from examples/data, 64-token sequences) but wider and deeper:
``build_4m`` is 5 blocks of width 256 (about 4M parameters), ``build_43m`` 6 blocks of width 768 (about
43M), ``build_120m`` 17 blocks of width 768 (about 120M). A 257-token vocabulary keeps the embedding small,
so the blocks hold nearly all of it. The planner's profiles, bench/profiles/gpt2_SIZE.json, were measured
on this 2-core machine at low load with ``spotmorph profile bench/gpt2_sizes.py:build_SIZE --micro-batch-sizes 1,2,4
--repeats 3 --out bench/profiles/gpt2_SIZE.json``.
"""

from __future__ import annotations

from pathlib import Path

from spotmorph import ModelSpec
from spotmorph.data import TokenFileDataset
from spotmorph.hf import causal_lm_spec, default_optimizer

DATA = Path(__file__).resolve().parents[1] / "examples" / "data"
SEQ_LEN = 64
SIZES = {"4m": (256, 5, 4), "43m": (768, 6, 12), "120m": (768, 17, 12)}  # width, blocks, heads


def build_size(size: str) -> ModelSpec:
    from transformers import GPT2Config, GPT2LMHeadModel  # here: what imports SIZES needs no transformers (6 s)

    width, blocks, heads = SIZES[size]
    train = TokenFileDataset(DATA / "lighthouse.bin", seq_len=SEQ_LEN)
    vocab = train.vocab_size or 257  # the sidecar names it; 257 is the byte tokenizer's
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=SEQ_LEN,
        n_embd=width,
        n_layer=blocks,
        n_head=heads,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    return causal_lm_spec(GPT2LMHeadModel(config), train, optimizer=default_optimizer(lr=1e-3))


def build_4m() -> ModelSpec:
    return build_size("4m")


def build_43m() -> ModelSpec:
    return build_size("43m")


def build_120m() -> ModelSpec:
    return build_size("120m")
