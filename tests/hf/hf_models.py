"""Small Hugging Face models for the adapter's tests, built from configs (nothing is downloaded).

Every dropout is on (0.1): embedding, residual and attention for GPT-2, attention for Llama. Samples
ignore a varying number of leading targets (-100), so token and sample normalisation differ.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from spotmorph import ModelSpec
from spotmorph.hf import causal_lm_spec

VOCAB = 61
SEQ = 16


class LabelledSequences:
    """Item ``i``: seeded random tokens; the first ``i % 5`` targets are ignored."""

    def __init__(self, size: int = 64, seq_len: int = SEQ) -> None:
        self.size = size
        self.seq_len = seq_len

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 + index)
        tokens = torch.randint(VOCAB, (self.seq_len + 1,), generator=gen)
        targets = tokens[1:].clone()
        targets[: index % 5] = -100
        return tokens[:-1].clone(), targets


def gpt2_model() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=2,
        vocab_size=VOCAB,
        n_positions=SEQ,
        bos_token_id=0,
        eos_token_id=0,
        embd_pdrop=0.1,
        resid_pdrop=0.1,
        attn_pdrop=0.1,
    )
    return GPT2LMHeadModel(config)


def llama_like(family: str, **config: Any) -> Any:
    """A two-layer, width-32 ``{family}ForCausalLM`` (Llama, Qwen2, Mistral) with attention dropout 0.1."""
    import transformers

    fields: dict[str, Any] = {
        "num_hidden_layers": 2, "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": SEQ, "attention_dropout": 0.1,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
    }  # fmt: skip
    settings = getattr(transformers, f"{family}Config")(**{**fields, **config})
    return getattr(transformers, f"{family}ForCausalLM")(settings)


def llama_model() -> Any:
    return llama_like("Llama")


def qwen2_model() -> Any:
    return llama_like("Qwen2", use_sliding_window=False)


def mistral_model() -> Any:
    return llama_like("Mistral", sliding_window=None)


def qwen2_sample() -> ModelSpec:
    return sampled(qwen2_model())


def mistral_sample() -> ModelSpec:
    return sampled(mistral_model())


def gpt2_token() -> ModelSpec:
    return causal_lm_spec(gpt2_model(), LabelledSequences())


def gpt2_sample() -> ModelSpec:
    return causal_lm_spec(gpt2_model(), LabelledSequences(), loss_normalization="sample")


def llama_token() -> ModelSpec:
    return causal_lm_spec(llama_model(), LabelledSequences(), lr_schedule=lambda step: 1e-2)


def llama_sample() -> ModelSpec:
    return sampled(llama_model())


def sampled(model: Any) -> ModelSpec:
    """A Llama-like model's spec: constant learning rate 1e-2, per-sample loss."""
    return causal_lm_spec(model, LabelledSequences(), lr_schedule=lambda step: 1e-2, loss_normalization="sample")


class Block(nn.Module):
    """A GPT-2 block wrapped by hand, as a user would without the adapter (attention stays SDPA)."""

    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.block(hidden)  # type: ignore[no-any-return]


class Embed(nn.Module):
    def __init__(self, wte: nn.Module) -> None:
        super().__init__()
        self.wte = wte

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.wte(ids)  # type: ignore[no-any-return]


def gpt2_by_hand() -> ModelSpec:
    """Hugging Face attention dropout draws from the global generator: refused at start-up."""
    model = gpt2_model()
    base = model.transformer
    layers: list[tuple[str, nn.Module]] = [("embed", Embed(base.wte))]
    layers += [(f"block{i}", Block(b)) for i, b in enumerate(base.h)]
    layers.append(("head", nn.Sequential(base.ln_f, model.lm_head)))
    token = causal_lm_spec(gpt2_model(), LabelledSequences())
    return ModelSpec(
        layers=layers,
        loss=token.loss,
        dataset=token.dataset,
        optimizer=token.optimizer,
        lr_schedule=token.lr_schedule,
        loss_normalization="token",
    )
