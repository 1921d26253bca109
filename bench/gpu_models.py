"""GPT models for the GPU benchmark, defined here so nothing is downloaded.

``build_gpt350m`` is GPT-2 medium's shape (24 blocks of width 1024, 16 heads, 1024 tokens, a 50,304-token
vocabulary with a tied head: about 355M parameters) on synthetic tokens; ``build_gpt_mid`` is a smaller
one for the memory comparison. Attention is PyTorch's fused causal SDPA (no dropout inside it; dropout is
layout-free, on the residual branches, and 0 by default so that the plain training loop computes the same).
"""

from __future__ import annotations

import torch
from torch import nn

from worker_agent.runtime.model.model_api import Dropout, ModelSpec


class SyntheticTokens:
    """Item ``i``: ``seq_len + 1`` pseudo-random tokens drawn from a generator seeded with ``i``."""

    def __init__(self, size: int, seq_len: int, vocab: int) -> None:
        self.size, self.seq_len, self.vocab = size, seq_len, vocab

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(self.vocab, (self.seq_len + 1,), generator=torch.Generator().manual_seed(index))
        return tokens[:-1], tokens[1:]


class Embedding(nn.Module):
    def __init__(self, vocab: int, width: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq_len, width) * 0.01)
        nn.init.normal_(self.tok.weight, std=0.02)
        self.drop = Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.drop(self.tok(tokens) + self.pos[: tokens.shape[1]])  # type: ignore[no-any-return]


class Block(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
        self.drop = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(d, 2))
        attn = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(attn.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(nn.functional.gelu(self.fc(self.ln2(x)))))  # type: ignore[no-any-return]


class Head(nn.Module):
    def __init__(self, width: int, vocab: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(width)
        self.out = nn.Linear(width, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))  # type: ignore[no-any-return]


def per_sample_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    flat = nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return flat.view(targets.shape).mean(dim=1)


def build_gpt(
    *, width: int, blocks: int, heads: int, seq_len: int, vocab: int = 50304, dropout: float = 0.0
) -> ModelSpec:
    embed = Embedding(vocab, width, seq_len, dropout)
    head = Head(width, vocab)
    head.out.weight = embed.tok.weight
    layers: list[tuple[str, nn.Module]] = [("embed", embed)]
    layers += [(f"block{i}", Block(width, heads, dropout)) for i in range(blocks)]
    layers.append(("head", head))

    def optimizer(params: list[tuple[str, nn.Parameter]]) -> torch.optim.Optimizer:
        return torch.optim.AdamW([p for _, p in params], lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)

    return ModelSpec(
        layers=layers,
        loss=per_sample_loss,
        dataset=SyntheticTokens(100_000, seq_len, vocab),
        optimizer=optimizer,
        lr_schedule=lambda step: 3e-4 * min(1.0, (step + 1) / 10),
        clip_grad_norm=1.0,
        name=f"gpt-{blocks}x{width}",
    )


def build_gpt350m() -> ModelSpec:
    return build_gpt(width=1024, blocks=24, heads=16, seq_len=1024)


def build_gpt_mid() -> ModelSpec:
    return build_gpt(width=768, blocks=8, heads=12, seq_len=512)


def build_gpt_smoke() -> ModelSpec:
    """Toy sizes of the same code, for ``bench/gpu_bench.py --smoke`` (which CI runs on a CPU)."""
    return build_gpt(width=32, blocks=2, heads=4, seq_len=16, vocab=128)


def build_gpt_large() -> ModelSpec:
    """32 blocks of width 3072 (about 3.8B parameters): with AdamW's fp32 state and bf16 activations of
    micro-batches of 4, more than half of an 80 GB or 141 GB GPU."""
    return build_gpt(width=3072, blocks=32, heads=24, seq_len=1024)
