"""The models now live in the ``fleet`` app; their tables stay where they are.

Only Django's state changes here (``fleet.0001`` adopts the same tables).  The
content types move too, so permissions and admin history follow the models.
"""

from django.db import migrations

MODELS = (
    "region", "regionlatency", "zone", "balancer", "replica",
    "serviceconfig", "apikey", "event", "metricrollup", "drillrun",
)  # fmt: skip


def _relabel(apps, from_label, to_label):
    content_type = apps.get_model("contenttypes", "ContentType")
    for model in MODELS:
        old = content_type.objects.filter(app_label=from_label, model=model)
        if content_type.objects.filter(app_label=to_label, model=model).exists():
            old.delete()  # already created under the new label (nothing refers to the old)
        else:
            old.update(app_label=to_label)


def _move_content_types(apps, schema_editor):
    _relabel(apps, "console", "fleet")


def _restore_content_types(apps, schema_editor):
    _relabel(apps, "fleet", "console")


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0004_drill_kinds"),
        ("fleet", "0001_initial"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [
        migrations.RunPython(_move_content_types, _restore_content_types),
        migrations.SeparateDatabaseAndState(
            database_operations=[],
            state_operations=[
                migrations.DeleteModel(
                    name="ApiKey",
                ),
                migrations.RemoveField(
                    model_name="balancer",
                    name="region",
                ),
                migrations.RemoveField(
                    model_name="replica",
                    name="balancer",
                ),
                migrations.RemoveField(
                    model_name="replica",
                    name="home_balancer",
                ),
                migrations.DeleteModel(
                    name="DrillRun",
                ),
                migrations.DeleteModel(
                    name="Event",
                ),
                migrations.DeleteModel(
                    name="MetricRollup",
                ),
                migrations.RemoveField(
                    model_name="replica",
                    name="region",
                ),
                migrations.RemoveField(
                    model_name="regionlatency",
                    name="target",
                ),
                migrations.RemoveField(
                    model_name="zone",
                    name="region",
                ),
                migrations.RemoveField(
                    model_name="regionlatency",
                    name="source",
                ),
                migrations.RemoveField(
                    model_name="replica",
                    name="zone",
                ),
                migrations.DeleteModel(
                    name="ServiceConfig",
                ),
                migrations.DeleteModel(
                    name="Balancer",
                ),
                migrations.DeleteModel(
                    name="Region",
                ),
                migrations.DeleteModel(
                    name="RegionLatency",
                ),
                migrations.DeleteModel(
                    name="Replica",
                ),
                migrations.DeleteModel(
                    name="Zone",
                ),
            ],
        ),
    ]
