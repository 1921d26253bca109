"""The per-VM worker agent: register, heartbeat, converge to the assignment, watch for evictions."""
