"""The per-VM worker agent and the training runtime it launches."""
