from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Meridian fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process that writes the topology (console, worker, commands, admin)
        # redraws the token balancers check before reading it in full.
        from fleet.topology_change import connect

        connect()
