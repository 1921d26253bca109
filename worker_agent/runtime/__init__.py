"""The training process: torch.distributed + torch.distributed.pipelining, checkpoints, calibration."""
