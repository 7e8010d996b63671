"""The console's live transport.

* ``feed``: reads the balancers' live streams (``meridian:live:region:<region>``, each
  balancer appends a record a second: ``routing.live_publish``): the last 15 minutes
  once, then what is new; and the replicas page's warnings from the newest records.
* ``snapshot``: lays the records out per region and per replica for the pages (the
  arithmetic is ``core.live_feed``), with since when a quiet part is quiet.
* ``messages``: group names and the typed payloads of Events and drill progress.
* ``publish``: sync helpers that ``group_send`` a message, and the ``Event`` post-save
  hook that puts every new Event on the ``console.events`` group after commit.
* ``plotly_static``: a staticfiles finder serving the plotly package's bundled
  ``plotly.min.js`` as ``console/vendor/plotly.min.js`` (no CDN; works offline).

``console.consumers`` is the staff-only WebSocket consumer: it runs the feed for its
page and forwards Events and drill progress.
"""
