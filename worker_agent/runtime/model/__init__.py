"""The user's model: the API an entrypoint returns (layers, loss, data, layout-free Dropout), loading it, the
start-up checks, partitioning into stages and tied weights, recomputation, token files, Hugging Face models
and their export, and a model built on the meta device."""
