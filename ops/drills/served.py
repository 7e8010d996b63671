"""Which model a drill's traffic asks for when the operator names none."""

from __future__ import annotations

from fleet.models import Replica
from ops.drills.targets import DrillError


def model_served_in(region: str) -> str:
    """A model a ready replica of ``region`` serves (by name, so drills repeat)."""
    ready = Replica.objects.filter(region__name=region, state=Replica.State.READY)
    model = ready.order_by("model_name").values_list("model_name", flat=True).first()
    if model is None:
        raise DrillError(f"no ready replica in {region}: give --model for the traffic")
    return str(model)
