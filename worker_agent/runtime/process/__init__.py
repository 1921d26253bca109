"""The trainer process: its entry point (``python -m worker_agent.runtime.process.trainer``), what it holds across
generations (:class:`~worker_agent.runtime.process.trainer_process.TrainerProcess`), a generation set up in named
phases, the step loop and its pure boundary decision, warm trainers and their zygote, and ``spotmorph train``'s
launcher and forked ranks."""
