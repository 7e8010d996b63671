from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Meridian"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Every process records Events (console actions, worker tasks, drill and
        # failover commands run from a shell): each publishes them to the live feed.
        from console.live.publish import connect_event_publishing

        connect_event_publishing()
