"""A checkpoint of a model from the Hugging Face adapter, written back as a ``save_pretrained`` directory.

The checkpoint names parameters the adapter's way (``embed.tokens.weight``, ``layer0.block...``); the
family's row in :data:`~worker_agent.runtime.model.hf_adapter.FAMILIES` maps them back to the model's own
state-dict names, so only the model's config is needed. The trainer writes it as ``hf_config.json`` in the
checkpoint root (beside the ``step-*`` directories, so the manifest format does not change); otherwise it
comes from a ``save_pretrained`` directory or the job's entrypoint.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from morphing.errors import UserInputError
from worker_agent.contract.hostile import HostileFile, load_json_bounded
from worker_agent.runtime.model.hf_adapter import hf_parameter_name
from worker_agent.runtime.model.model_api import ModelSpec
from worker_agent.runtime.storage.checkpoint import Checkpoint, CheckpointError, atomic_write, read_all

CONFIG_FILE = "hf_config.json"
MAX_CONFIG_BYTES = 1 << 20


def write_config(checkpoint_dir: Path, spec: ModelSpec) -> None:
    """``hf_config.json`` in the checkpoint root when the model came from the adapter (a no-op otherwise)."""
    config = spec.extra.get("hf_config")
    if config is None:
        return
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    atomic_write(checkpoint_dir / CONFIG_FILE, config.to_json_string(use_diff=False).encode())


def _config_class(data: dict[str, Any], where: str) -> Any:
    from transformers import CONFIG_MAPPING

    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise UserInputError(f"{where}: no known model_type ({model_type!r})")
    try:
        return CONFIG_MAPPING[model_type].from_dict(data)
    except Exception as exc:
        raise UserInputError(f"{where}: not a {model_type} config ({exc})") from exc


def _config_next_to(ckpt: Checkpoint) -> Any:
    for folder in (ckpt.path.parent, ckpt.path):
        path = folder / CONFIG_FILE
        try:
            data = load_json_bounded(path, MAX_CONFIG_BYTES, follow_symlinks=True)
        except FileNotFoundError:
            continue
        except HostileFile as exc:
            raise UserInputError(f"{CONFIG_FILE} is damaged: {exc}") from None
        if not isinstance(data, dict):
            raise UserInputError(f"{path} is damaged: not a JSON object")
        return _config_class(data, str(path))
    raise UserInputError(
        f"no {CONFIG_FILE} beside {ckpt.path}: it was not written for a model from spotmorph.hf; "
        "pass --config-from with the model's save_pretrained directory or the job's entrypoint"
    )


def read_config(ckpt: Checkpoint, source: str | None) -> Any:
    """The model's config: from ``source`` (a ``save_pretrained`` dir or ``file.py:function``) or the
    ``hf_config.json`` the trainer wrote beside the checkpoint."""
    if source is None:
        return _config_next_to(ckpt)
    if Path(source).is_dir():
        from transformers import AutoConfig

        try:
            return AutoConfig.from_pretrained(source, local_files_only=True)
        except Exception as exc:
            raise UserInputError(f"--config-from {source}: no Hugging Face config there ({exc})") from exc
    from worker_agent.runtime.model.entrypoint import build_spec

    spec = build_spec(source, ckpt.manifest.job.seed, check=False)
    config = spec.extra.get("hf_config")
    if config is None:
        raise UserInputError(f"--config-from {source}: its spec was not built by spotmorph.hf.causal_lm_spec")
    return config


def checkpoint_state(ckpt: Checkpoint, config: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The checkpoint's parameters under the adapter's names and under the model's own state-dict names,
    refused (before anything is allocated) unless they are those of the config's model."""
    try:
        params = {n[len("param/") :]: t for n, t in read_all(ckpt).items() if n.startswith("param/")}
    except CheckpointError as exc:
        raise UserInputError(f"checkpoint {ckpt.path} is damaged: {exc}") from exc
    state: dict[str, torch.Tensor] = {}
    for name, tensor in params.items():
        hf_name = hf_parameter_name(str(config.model_type), name)
        if hf_name is None:
            raise UserInputError(
                f"checkpoint {ckpt.path} holds {name!r}, which is no parameter of a {config.model_type} model "
                "from spotmorph.hf: it was written for another model"
            )
        state[hf_name] = tensor
    _check_fits(ckpt, config, state, layers=len({n.split(".", 1)[0] for n in params if n.startswith("layer")}))
    return params, state


def state_dtype(state: dict[str, torch.Tensor]) -> torch.dtype:
    """The checkpoint's dtype: its parameters' one dtype (float32 if they are mixed)."""
    dtypes = {t.dtype for t in state.values()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Transformers' progress bars off (and back on after): a bar on stderr would bury the one-line result."""
    from transformers.utils import logging

    shown = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if shown:
            logging.enable_progress_bar()


def export(ckpt: Checkpoint, config: Any, out: Path) -> list[str]:
    """Write ``out`` (config + safetensors) from the checkpoint's parameters; returns the parameter names."""
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM  # untyped in transformers' stubs
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"{out} exists and is not an empty directory; name a new one")
    _, state = checkpoint_state(ckpt, config)
    model = auto.from_config(config).to(state_dtype(state))
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise UserInputError(f"checkpoint {ckpt.path} does not fit this config: {str(exc).splitlines()[-1]}") from exc
    out.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():
        model.save_pretrained(str(out))
    return sorted(state)


def _check_fits(ckpt: Checkpoint, config: Any, state: dict[str, torch.Tensor], layers: int) -> None:
    """Refuse a config that does not describe the checkpoint's model before anything is allocated: its layer
    count first (a model is built layer by layer), then every shape on the meta device (no memory), so a
    config from a file (a huge ``n_embd``, a negative one) is an error naming the mismatch, not an
    allocation of the config's size or a traceback."""
    from transformers import AutoModelForCausalLM

    auto: Any = AutoModelForCausalLM
    stated = getattr(config, "num_hidden_layers", None)
    if stated != layers:
        raise UserInputError(
            f"checkpoint {ckpt.path} holds {layers} decoder layers but its {config.model_type} config says "
            f"{stated!r}: the config is of another model"
        )
    try:
        with torch.device("meta"):
            skeleton = auto.from_config(config)
    except Exception as exc:
        raise UserInputError(f"the {config.model_type} config describes no model: {str(exc)[:200]}") from None
    shapes = {name: tuple(p.shape) for name, p in skeleton.named_parameters(remove_duplicate=False)}
    wrong = [f"{n} {tuple(t.shape)} vs {shapes[n]}" for n, t in state.items() if shapes.get(n, t.shape) != t.shape]
    missing = [n for n, _ in skeleton.named_parameters() if n not in state]
    unexpected = [n for n in state if n not in shapes]
    if wrong or missing or unexpected:
        raise UserInputError(
            f"checkpoint {ckpt.path} does not fit this {config.model_type} config: shapes (checkpoint vs config) "
            f"{wrong[:2]}, unexpected {sorted(unexpected)[:3]}, missing {missing[:3]}"
        )
