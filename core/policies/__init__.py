"""One module per routing policy; ``core.registry`` builds them by name."""
