"""The Hugging Face adapter in one process: the cut model computes what the model computes, attention
dropout is a function of the sample, losses average the way language models do, and what cannot be made
layout-free is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from morphing.errors import UserInputError
from spotmorph.hf import causal_lm_spec, sample_losses, token_losses
from tests.hf import hf_models as hm
from tests.runtime.helpers import REPO
from worker_agent.runtime.model.entrypoint import build_spec
from worker_agent.runtime.model.hf_float64 import keep_float64
from worker_agent.runtime.model.model_api import sample_context
from worker_agent.runtime.model.partition import PartitionedModel
from worker_agent.runtime.numerics.batch import run_layers, weighted_loss


def mistral_model() -> nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=1,
        vocab_size=hm.VOCAB, max_position_embeddings=hm.SEQ, sliding_window=5, pad_token_id=0,
    )  # fmt: skip
    model: nn.Module = MistralForCausalLM(config)
    return model


def qwen2_model() -> nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=hm.VOCAB, max_position_embeddings=hm.SEQ, tie_word_embeddings=True, pad_token_id=0,
    )  # fmt: skip
    model: nn.Module = Qwen2ForCausalLM(config)
    return model


def batch(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    items = [hm.LabelledSequences()[i] for i in range(n)]
    return torch.stack([x for x, _ in items]), torch.stack([t for _, t in items])


@pytest.mark.slow
@pytest.mark.parametrize("build", [hm.gpt2_model, hm.llama_model, mistral_model, qwen2_model])
def test_the_cut_model_computes_the_models_logits(build: object) -> None:
    torch.manual_seed(0)
    model = build().double().eval()  # type: ignore[operator]
    ids, _ = batch()
    with torch.no_grad():
        family_own = model(input_ids=ids).logits  # RMSNorm through float32, even in float64
        keep_float64(model)  # as the adapter does: the family's code, its float32 upcasts in float64
        expected = model(input_ids=ids).logits
        spec = causal_lm_spec(model, hm.LabelledSequences())
        got = run_layers([m for _, m in spec.layers], ids)
    assert [n for n, _ in spec.layers] == ["embed", "layer0", "layer1", "head"]
    assert (got - expected).abs().max() < 1e-12
    assert (got - family_own).abs().max() < 1e-6  # only float32 roundings apart


def test_position_ids_may_come_from_the_dataset() -> None:
    torch.manual_seed(0)
    model = hm.llama_model().double().eval()
    keep_float64(model)
    ids, _ = batch()
    positions = torch.arange(ids.shape[1]).repeat(ids.shape[0], 1) + torch.tensor([[0], [3], [5], [7]])
    with torch.no_grad():
        expected = model(input_ids=ids, position_ids=positions).logits
        spec = causal_lm_spec(model, hm.LabelledSequences())
        got = run_layers([m for _, m in spec.layers], (ids, positions))
    assert (got - expected).abs().max() < 1e-12


def test_attention_dropout_is_a_function_of_the_sample_not_of_the_micro_batch() -> None:
    torch.manual_seed(0)
    spec = causal_lm_spec(hm.gpt2_model().double().train(), hm.LabelledSequences())
    layers = [m for _, m in spec.layers]
    attention: Any = layers[1].block.attn  # type: ignore[union-attr]
    assert attention.spotmorph_attn_dropout.p == 0.1 and attention.config._attn_implementation.startswith("spotmorph")
    ids, _ = batch()
    with torch.no_grad():
        with sample_context(7, 3, torch.tensor([10, 11, 12, 13])):
            whole = run_layers(layers, ids)
        with sample_context(7, 3, torch.tensor([12])):
            alone = run_layers(layers, ids[2:3])
        with sample_context(7, 4, torch.tensor([12])):
            next_step = run_layers(layers, ids[2:3])
    # The same masks: a different mask moves values by ~0.1. The batch of four and the batch of one may differ
    # in the last bit (5.6e-17 with transformers 5.24: batch-size-dependent float64 kernels; bitwise is issue 23).
    assert torch.allclose(whole[2:3], alone, rtol=0, atol=1e-12), (whole[2:3] - alone).abs().max()
    assert not torch.allclose(alone, next_step)


def test_tied_embedding_and_head_share_one_parameter() -> None:
    spec = causal_lm_spec(hm.gpt2_model(), hm.LabelledSequences())
    layers = dict(spec.layers)
    assert layers["head"].lm_head.weight is layers["embed"].tokens.weight  # type: ignore[union-attr]
    model = PartitionedModel(spec)
    assert model.params["embed.tokens.weight"].layers == (0, 3)
    assert "head.lm_head.weight" not in model.params


def test_token_mode_averages_over_predicted_tokens_and_sample_mode_over_samples() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, hm.SEQ, hm.VOCAB, dtype=torch.float64)
    _, targets = batch()
    ones = torch.ones(4, dtype=torch.float64)
    valid = int((targets != -100).sum())
    token = weighted_loss(token_losses(logits, targets), targets, ones, "token", valid)
    expected = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert float(token) == pytest.approx(float(expected), rel=1e-12)
    per_sample = [nn.functional.cross_entropy(logits[i], targets[i], ignore_index=-100) for i in range(4)]
    sample = weighted_loss(sample_losses(logits, targets), targets, ones, "sample", 4)
    assert float(sample) == pytest.approx(float(sum(per_sample)) / 4, rel=1e-12)
    padded = weighted_loss(token_losses(logits, targets), targets, torch.tensor([1.0, 1, 0, 0]).double(), "token", 1)
    assert float(padded) == pytest.approx(float(token_losses(logits[:2], targets[:2]).sum()), rel=1e-12)


def test_without_a_schedule_the_optimizer_keeps_its_learning_rate() -> None:
    spec = causal_lm_spec(
        hm.gpt2_model(), hm.LabelledSequences(), optimizer=lambda ps: torch.optim.SGD([p for _, p in ps], lr=0.05)
    )
    params = list(PartitionedModel(spec).tensors.items())
    group = spec.optimizer(params).param_groups[0]
    assert spec.lr_schedule(10) * group["lr_scale"] == 0.05


def test_a_save_pretrained_directory_loads_locally(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = hm.llama_model()
    model.save_pretrained(tmp_path / "saved")
    spec = causal_lm_spec(str(tmp_path / "saved"), hm.LabelledSequences())
    embed: Any = dict(spec.layers)["embed"]
    assert torch.equal(embed.tokens.weight, model.model.embed_tokens.weight)
    with pytest.raises(UserInputError, match="not a directory written by save_pretrained"):
        causal_lm_spec(str(tmp_path / "missing"), hm.LabelledSequences())


def test_an_unknown_family_is_refused_naming_it() -> None:
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    config = GPTNeoConfig(
        num_layers=2, hidden_size=32, num_heads=2, vocab_size=hm.VOCAB, attention_types=[[["global"], 2]]
    )
    with pytest.raises(UserInputError, match=r"model_type 'gpt_neo'.*supported: gpt2, llama"):
        causal_lm_spec(GPTNeoForCausalLM(config), hm.LabelledSequences())


def test_the_adapted_models_pass_the_start_up_checks() -> None:
    for entry in ("gpt2_token", "llama_sample"):
        build_spec(f"{REPO}/tests/hf/hf_models.py:{entry}", 0)


def test_hugging_face_attention_dropout_without_the_adapter_is_refused() -> None:
    expected = (
        r"layer 'block0' gives different outputs .* global random state .*it is block0.block.attn \(GPT2Attention\)"
    )
    with pytest.raises(UserInputError, match=expected):
        build_spec(f"{REPO}/tests/hf/hf_models.py:gpt2_by_hand", 0)


def test_the_profiler_counts_every_tensor_a_layer_passes_on(tmp_path: Path) -> None:
    from morphing.profile import parse_profile
    from spotmorph.cli import main

    out = tmp_path / "profile.json"
    entry = f"{REPO}/tests/hf/hf_models.py:llama_token"
    assert main(["profile", entry, "--micro-batch-sizes=1,2", "--repeats=1", "--no-network", f"--out={out}"]) == 0
    layers = parse_profile(out.read_text()).layers
    hidden, positions = hm.SEQ * 32 * 4, hm.SEQ * 8  # float32 hidden states and int64 position ids
    assert [layer.output_activation_bytes_per_sample for layer in layers] == [hidden + positions] * 3 + [0]
