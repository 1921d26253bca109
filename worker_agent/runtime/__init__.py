"""The training process: torch.distributed and the runtime's own pipeline schedules, checkpoints, calibration."""
