"""The controller daemon and the client side of the CLI (built with the controller issue)."""
