"""Demo model: a small decoder-only transformer with a tied embedding and output head.

The task is synthetic and deterministic: sample ``i`` is an arithmetic progression modulo the vocabulary
size whose start and stride are a function of ``i``. The model must read the stride from the context,
so the loss falls from ``ln(vocab)`` towards zero within a few hundred steps on a CPU.

``build()`` is the entrypoint (``spotmorph train examples/tiny_gpt.py:build ...``); ``build_config``
makes smaller or larger variants (tests use a tiny one).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from worker_agent.runtime.model.model_api import Dropout, ModelSpec


class ProgressionDataset:
    """Sample ``i``: tokens ``(start + k * stride) mod vocab``; input is tokens[:-1], target tokens[1:]."""

    def __init__(self, size: int, seq_len: int, vocab: int, strides: int) -> None:
        self.size = size
        self.seq_len = seq_len
        self.vocab = vocab
        self.strides = strides

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = (index * 7919) % self.vocab
        stride = 1 + (index * 104729 // self.vocab) % self.strides
        tokens = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab
        return tokens[:-1].clone(), tokens[1:].clone()


class Embedding(nn.Module):
    def __init__(self, vocab: int, d_model: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        nn.init.normal_(self.tok.weight, std=0.1)
        self.pos = nn.Parameter(torch.randn(seq_len, d_model) * 0.02)
        self.drop = Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens) + self.pos[: tokens.shape[1]]
        return self.drop(x)  # type: ignore[no-any-return]


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(attn))
        return x + self.drop(self.out(nn.functional.gelu(self.fc(self.ln2(x)))))  # type: ignore[no-any-return]


class Head(nn.Module):
    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))  # type: ignore[no-any-return]


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of each sample: shape ``[batch]``."""
    flat = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    return flat.view(targets.shape).mean(dim=1)


def build_config(
    *,
    vocab: int = 32,
    d_model: int = 32,
    heads: int = 2,
    blocks: int = 4,
    seq_len: int = 16,
    dropout: float = 0.1,
    dataset_size: int = 4096,
    strides: int = 3,
    lr: float = 3e-3,
    warmup: int = 20,
    clip: float | None = 1.0,
) -> ModelSpec:
    """A tiny GPT; the layers are ``embed``, ``block0`` .. ``block{n-1}``, ``head`` (head tied to embed)."""
    embed = Embedding(vocab, d_model, seq_len, dropout)
    head = Head(d_model, vocab)
    head.out.weight = embed.tok.weight
    layers: list[tuple[str, nn.Module]] = [("embed", embed)]
    layers += [(f"block{i}", Block(d_model, heads, dropout)) for i in range(blocks)]
    layers.append(("head", head))

    def optimizer(params: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        decay = [p for n, p in params if p.dim() >= 2]
        no_decay = [p for n, p in params if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=(0.9, 0.98))

    def lr_schedule(step: int) -> float:
        return lr * min(1.0, (step + 1) / warmup)

    return ModelSpec(
        layers=layers,
        loss=per_sample_loss,
        dataset=ProgressionDataset(dataset_size, seq_len, vocab, strides),
        optimizer=optimizer,
        lr_schedule=lr_schedule,
        clip_grad_norm=clip,
        name=f"tiny_gpt-{blocks}x{d_model}",
    )


def build_tiny() -> ModelSpec:
    """A test-sized variant: 2 blocks of width 16 on 8-token sequences (4 layers in all)."""
    return build_config(d_model=16, blocks=2, seq_len=8, dataset_size=512, vocab=16)


def build() -> ModelSpec:
    """The demo model: 4 blocks of width 32 on 16-token progressions over 32 symbols."""
    return build_config()
