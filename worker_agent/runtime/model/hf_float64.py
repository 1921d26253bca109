"""Float64 means float64 in Hugging Face models: the upcasts to float32 that fp16/bf16 need stay, and in a
float64 job they compute in float64.

Llama's, Qwen2's and Mistral's RMSNorm cast their input to float32 whatever it is, and their rotary
embeddings compute their angles in float32. In a float64 job the RMSNorm cast turns differences of 1e-15
(the order a layout sums in) into float32 roundings of 1e-7: a 1x2 run left a 1x1 run by 2e-7 in a hundred
steps. Here each such module computes in ``float32`` for inputs of lower or equal precision, exactly as
the family's code does, and in ``float64`` for float64 inputs. Rotary embeddings other than the default
(dynamic, scaled) are left as they are; the float64 start-up check (:mod:`worker_agent.runtime.model.precision`)
names any module that still computes below the job's dtype.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _rms_norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(_compute_dtype(input_dtype))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)  # type: ignore[no-any-return]


@torch.no_grad()
def _rotary_forward(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    compute = _compute_dtype(x.dtype)
    freqs = position_ids[..., None].to(compute) * self.inv_freq.to(device=x.device, dtype=compute)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def keep_float64(model: nn.Module) -> list[str]:
    """Patch ``model``'s RMSNorms and default rotary embeddings (see the module docstring); their names."""
    patched = []
    for name, module in model.named_modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm") and hasattr(module, "variance_epsilon") and hasattr(module, "weight"):
            module.forward = types.MethodType(_rms_norm_forward, module)
            patched.append(name)
        elif (
            kind.endswith("RotaryEmbedding")
            and getattr(module, "rope_type", "default") == "default"
            and hasattr(module, "inv_freq")
            and hasattr(module, "attention_scaling")
        ):
            module.forward = types.MethodType(_rotary_forward, module)
            patched.append(name)
    return patched
