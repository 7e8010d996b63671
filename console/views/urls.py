from django.urls import path

from console.views import (
    charts,
    cost,
    drills,
    events,
    forecast,
    keys,
    regions,
    replicas,
    service,
    simulations,
)
from console.views.cost_metrics import cost_metrics
from console.views.overview import overview
from console.views.topology import topology

urlpatterns = [
    path("", overview, name="overview"),
    path("internal/topology", topology, name="internal-topology"),
    path("metrics/cost", cost_metrics, name="metrics-cost"),
    path("console/charts", charts.charts, name="console-charts"),
    path("console/charts/history", charts.history, name="console-history"),
    path("console/cost", cost.cost, name="console-cost"),
    path("console/replicas", replicas.replicas, name="console-replicas"),
    path(
        "console/replicas/<slug:name>/<slug:action>",
        replicas.replica_action,
        name="console-replica-action",
    ),
    path("console/regions", regions.regions, name="console-regions"),
    path("console/regions/new/<slug:kind>", regions.create, name="console-create"),
    path("console/regions/<slug:kind>/<slug:name>", regions.edit, name="console-edit"),
    path("console/events", events.events, name="console-events"),
    path("console/keys", keys.keys, name="console-keys"),
    path("console/drills", drills.drills, name="console-drills"),
    path("console/drills/<slug:name>", drills.run, name="console-drill-run"),
    path("console/service", service.service_settings, name="console-service"),
    path("console/simulations", simulations.simulations, name="console-simulations"),
    path("console/forecast", forecast.forecast, name="console-forecast"),
    path(
        "console/simulations/<str:name>",
        simulations.simulation_report,
        name="console-simulation-report",
    ),
    path("console/service/<int:pk>/policy", service.change_policy, name="console-policy"),
    path(
        "console/service/<int:pk>/autoscaling",
        service.change_autoscaling,
        name="console-autoscaling",
    ),
]
