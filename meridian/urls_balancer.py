"""The URLconf of a balancer process (``MERIDIAN_BALANCER`` set): the data plane only.

A balancer's port faces API clients, so it serves the OpenAI API, its operator and
internal endpoints (``routing.urls``) and ``/internal/topology``, which tells
clients which balancer serves their region.  The console's pages, its live socket
and Django's admin login are served on the console's port alone
(``meridian.urls``): nothing a client can reach on a balancer asks for a password.
"""

from django.urls import include, path

from console.views.topology import topology

urlpatterns = [
    path("", include("routing.urls")),
    path("internal/topology", topology, name="internal-topology"),
]
