from django.urls import path

from console.views.overview import overview
from console.views.topology import topology

urlpatterns = [
    path("", overview, name="overview"),
    path("internal/topology", topology, name="internal-topology"),
]
