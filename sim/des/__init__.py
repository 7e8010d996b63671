"""The discrete-event simulator: Meridian's own routing code in virtual time.

It runs *the same objects* as a balancer process (``core``: the
dispatch core with its placement, FCFS queue hand-off, retries and deadlines,
the ``LocalRouter``/``RemoteRouter`` layers, SP-P/SP-O/blind availability,
every registry policy) and as an emulated replica (``sim.engine.Engine``),
replacing only I/O and clocks:

* ``loop``: the event heap (virtual time, deterministic tie order);
* ``config``: ``SimConfig`` (regions, replicas, clients, policy, production's
  timing defaults, RTTs) and the command-line parsers;
* ``calls``: one request's hops (client → balancer → peer → replica) and results;
* ``replica``: ``SimReplica``, the engine stepped in virtual time;
* ``balancer``: ``SimBalancer``, the production ``DispatchCore`` driven in
  virtual time: its clock, its transport (replicas and peers one way away),
  probes and peer polls;
* ``clients``: programs of dependent steps, closed- or open-loop, per region;
* ``workloads``: which programs each region runs (mixing with ``+``, ServeGen
  time shifts, traces dealt across regions);
* ``world``: builds a deployment (regional, region-local or single balancer)
  and runs it: ``simulate(config)``;
* ``metrics``: ``summarize(run)``: goodput and SLO attainment over all requests
  (rejections and drops are misses), throughput, TTFT/e2e percentiles, KV hit
  rate and its oracle bounds, outstanding variance, share forwarded, queue waits;
* ``oracle``: the hit-rate bounds (one infinite cache; the fleet's KV pooled as
  one LRU cache), pure functions over the requests' block keys;
* ``report``: the console table (ranked by goodput) and the plotly HTML report,
  which loads plotly.js from beside it;
* ``saved_reports``: where reports are saved and ``list_reports()`` over
  ``VAR_DIR/simulations/`` (no plotly, for the console's pages);
* ``experiments``: SkyLB §5's Figures 8, 9 and 10 as ready-made sweeps.
"""

from __future__ import annotations
