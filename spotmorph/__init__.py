"""The ``spotmorph`` command: a composition root that mounts each component's subcommands."""
