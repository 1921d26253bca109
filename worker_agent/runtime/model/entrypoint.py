"""Loading a user's entrypoint: import it, build its ModelSpec, validate it and run the start-up checks.

Kept apart from :mod:`worker_agent.runtime.model.model_api` (the values a user builds) because the checks run
the user's layers, which needs the model API itself.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from morphing.errors import UserInputError
from worker_agent.runtime.model.checks import check_spec
from worker_agent.runtime.model.model_api import ModelSpec, assign_dropout_keys, make_dropout_layout_free
from worker_agent.runtime.numerics.batch import NORMALIZATIONS


def load_entrypoint(entrypoint: str) -> Callable[[], Any]:
    """The function an entrypoint names; a :class:`UserInputError` says what is wrong with it."""
    target, sep, func_name = entrypoint.rpartition(":")
    if not sep or not target or not func_name:
        raise UserInputError(
            f"entrypoint {entrypoint!r} must look like path/to/file.py:function or package.module:function"
        )
    if target.endswith(".py") or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise UserInputError(f"entrypoint file {target} does not exist")
        # Its own directory first, as `python file.py` would have it: helper modules next to it import.
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        module_name = "spotmorph_user_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise UserInputError(f"entrypoint file {target} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            raise UserInputError(f"importing {target} failed: {exc!r}") from exc
    else:
        # The current directory first, as `python -m` has it: `spotmorph train mymodel:build` (a console script,
        # whose sys.path starts at its own bin/) imports mymodel.py from where the user stands.
        here = os.getcwd()
        if here not in sys.path and "" not in sys.path:
            sys.path.insert(0, here)
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise UserInputError(f"entrypoint module {target} cannot be imported: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UserInputError(f"entrypoint {entrypoint!r}: {target} has no function {func_name!r}")
    return func  # type: ignore[no-any-return]


def build_spec(entrypoint: str, seed: int, *, check: bool = True) -> ModelSpec:
    """Call the entrypoint under ``torch.manual_seed(seed)`` so every rank builds identical weights.

    Plain ``torch.nn.Dropout`` modules become layout-free :class:`Dropout`, and the start-up checks
    (:mod:`worker_agent.runtime.model.checks`) run here, in one process before any rendezvous, so a model
    the runtime cannot train layout-free is refused with exit 2 whatever the layout.
    """
    func = load_entrypoint(entrypoint)
    torch.manual_seed(seed)
    try:
        spec = func()
    except UserInputError:
        raise
    except Exception as exc:
        raise UserInputError(f"entrypoint {entrypoint!r} raised {exc!r}") from exc
    spec = validate_spec(spec, entrypoint)
    make_dropout_layout_free(spec.layers)
    assign_dropout_keys(spec.layers)
    if check:
        check_spec(spec, entrypoint)
    return spec


def validate_spec(spec: object, entrypoint: str) -> ModelSpec:
    if not isinstance(spec, ModelSpec):
        raise UserInputError(
            f"entrypoint {entrypoint!r} returned {type(spec).__name__}, expected "
            "worker_agent.runtime.model.model_api.ModelSpec (see docs/runtime.md)"
        )
    names = [name for name, _ in spec.layers]
    if not names:
        raise UserInputError(f"entrypoint {entrypoint!r}: the model spec lists no layers")
    if len(set(names)) != len(names):
        raise UserInputError(f"entrypoint {entrypoint!r}: layer names must be unique, got {names}")
    for name, module in spec.layers:
        if not isinstance(module, nn.Module):
            raise UserInputError(f"entrypoint {entrypoint!r}: layer {name!r} is not a torch.nn.Module")
        if not name or "." in name or "/" in name:
            raise UserInputError(f"entrypoint {entrypoint!r}: layer name {name!r} must be non-empty, no . or /")
    if spec.loss_normalization not in NORMALIZATIONS:
        raise UserInputError(
            f"entrypoint {entrypoint!r}: loss_normalization={spec.loss_normalization!r}; use 'sample' or 'token'"
        )
    for attr in ("loss", "optimizer", "lr_schedule"):
        if not callable(getattr(spec, attr)):
            raise UserInputError(f"entrypoint {entrypoint!r}: spec.{attr} must be callable")
    try:
        size = len(spec.dataset)
    except TypeError as exc:
        raise UserInputError(f"entrypoint {entrypoint!r}: spec.dataset has no len()") from exc
    if size <= 0:
        raise UserInputError(f"entrypoint {entrypoint!r}: the dataset is empty")
    return spec
