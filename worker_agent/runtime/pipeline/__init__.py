"""One rank's step: process groups and their backends, a pipeline stage and its boundary tensors, the 1F1B and
GPipe schedules, and the stage runner that trains, evaluates and hands out its state."""
