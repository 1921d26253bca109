"""Checkpoints on a share: the format (per layer, a manifest written last), its streams and checksums, durable
writes, the writer (in the background, from host buffers), and the fence that stops an older generation's
writes. Imports no other part of the runtime (errors aside)."""
