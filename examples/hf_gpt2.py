"""A small GPT-2 from Hugging Face transformers, trained on a byte-level corpus shipped beside this file.

``examples/data/lighthouse.txt`` (a short story written for this example, public domain) and
``lighthouse_eval.txt`` (held out) were turned into token files with ``spotmorph data prepare
examples/data/lighthouse.txt --out examples/data/lighthouse.bin`` (and the same for the eval file); the
model is built from a config, so nothing is downloaded. Train it with
``spotmorph train examples/hf_gpt2.py:build --stages 2 --replicas 1 --global-batch 8 --steps 100
--eval-interval 20`` or submit ``examples/hf_gpt2.yaml``; export the result with
``spotmorph checkpoint export CHECKPOINT_DIR --hf OUT``.
"""

from __future__ import annotations

from pathlib import Path

from transformers import GPT2Config, GPT2LMHeadModel

from spotmorph import ModelSpec
from spotmorph.data import TokenFileDataset
from spotmorph.hf import causal_lm_spec, default_optimizer

DATA = Path(__file__).resolve().parent / "data"
SEQ_LEN = 64


def build() -> ModelSpec:
    train = TokenFileDataset(DATA / "lighthouse.bin", seq_len=SEQ_LEN)
    held_out = TokenFileDataset(DATA / "lighthouse_eval.bin", seq_len=SEQ_LEN)
    vocab = train.vocab_size or 257  # the sidecar names it; 257 is the byte tokenizer's
    config = GPT2Config(
        vocab_size=vocab,
        n_positions=SEQ_LEN,
        n_embd=64,
        n_layer=4,
        n_head=4,
        bos_token_id=vocab - 1,  # the byte tokenizer's end-of-document id
        eos_token_id=vocab - 1,
    )
    return causal_lm_spec(GPT2LMHeadModel(config), train, eval_dataset=held_out, optimizer=default_optimizer(lr=1e-3))
