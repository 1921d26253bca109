"""Measuring a model for the planner (``spotmorph profile``: each layer timed, its memory, a model larger than
the device), a layout's stage memory on a GPU, and a trainer's steps under torch.profiler."""
