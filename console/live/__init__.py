"""The console's live transport (Channels over the Redis channel layer).

* ``messages``: group names and the typed payloads sent to them (one module, so the
  consumer, the publishers and the browser agree on every field).
* ``snapshot``: pure aggregation of the balancers' ``/internal/state``, heartbeats and
  the latest rollups into ONE per-region snapshot per tick (rates from counter deltas).
* ``publish``: sync helpers that ``group_send`` a message, and the ``Event`` post-save
  hook that puts every new Event on the ``console.events`` group after commit.
* ``plotly_static``: a staticfiles finder serving the plotly package's bundled
  ``plotly.min.js`` as ``console/vendor/plotly.min.js`` (no CDN; works offline).
* ``tick``: one live tick: gather the topology rows, balancer states, heartbeats and
  rollups, build the snapshot, send it.
* ``tasks``: the Celery beat task that runs a tick (``live-snapshot``).

``console.consumers`` is the staff-only WebSocket consumer that forwards all three.
"""
