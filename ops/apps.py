from django.apps import AppConfig


class OpsConfig(AppConfig):
    """Installed so Django finds the management commands in ``ops/management``."""

    name = "ops"
    verbose_name = "Meridian operator tooling"
