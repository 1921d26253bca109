"""A trainer's link to its agent and its peers: its progress events and log lines, stop, checkpoint and lease
files, the spool it waits in for an assignment, the start-up watchdog, and the generation's gated rendezvous
store. Imports no other part of the runtime."""
