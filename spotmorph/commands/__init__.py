"""Subcommands of ``spotmorph`` that belong to no single component."""
