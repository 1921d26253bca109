"""The training process: torch.distributed and the runtime's own pipeline schedules, checkpoints, calibration.

In layers that import only downward (import-linter checks them, ``pyproject.toml``): ``process`` (the trainer,
its generations and steps) > ``morph`` (state between generations) > ``pipeline`` | ``profiling`` > ``model``
(the user's model) > ``numerics`` | ``storage`` | ``link`` (the trainer's files and store shared with its agent
and peers) > ``errors``.
"""
