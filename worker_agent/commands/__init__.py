"""``spotmorph`` subcommands owned by the worker agent: train, profile, checkpoint (torch imported lazily)."""
