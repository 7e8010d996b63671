"""One module per routing policy; ``routing.core.registry`` builds them by name."""
