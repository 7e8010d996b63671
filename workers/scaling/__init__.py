"""Scaling and placement: SkyServe's autoscaler and SpotHedge, plus the baselines.

Pure modules (no Django, no cloud calls; the simulator and the live controller run
the very same objects):

- ``fleet``       ZoneOffer, FleetReplica, Fleet, MixTarget, the Launcher protocol
- ``base``        PlacementPolicy (mix, next spot zone, preemption/ready callbacks)
- ``spothedge``   Dynamic Placement (Algorithm 1) + N_extra + Dynamic Fallback (§3)
- ``even_spread`` static even spread (ASG, MArk)
- ``round_robin`` round robin across zones (Ray Serve, GKE)
- ``static_mix``  fixed on-demand base + evenly spread spot (ASG with a base)
- ``on_demand``   on-demand only, the cost reference
- ``registry``    build_policy(name, zones, ...)
- ``reconcile``   one step: terminate the excess, launch the deficit
- ``autoscaler``  request-rate autoscaler, N_can = ceil(R / Q_tar) with delays (§4)
- ``controller``  one service's beat: autoscaler, policy state, reconcile, state to store
- ``traces``      SkyPilot spot traces by path; Poisson spot model
- ``prices``      per-zone spot prices from AWS price-history JSON
- ``simulate``    virtual-time replay of a trace under a policy
- ``workload_forecast`` token density per window: MSTL + smoothing (PreServe §4.1)
- ``forecast_eval`` rolling-origin APE of the forecaster, and the naive baseline
- ``workload_traces`` per-window demand from ServeGen and Azure trace files
- ``instance_scaler`` PreServe's instance scaler (§4.3.2): forecast N, overload, scale-down
- ``scalers``     scaling policies by name: request-rate, preserve (how many)
- ``demand_sim``  a day of demand under a scaling policy and SpotHedge (fluid serving)
- ``region_placement`` demand-aware placement across regions within RTT and spill limits

The Django side lives beside the package, in ``workers.scaling_glue``: it reads the
rows into these dataclasses, launches through a provider (``workers.providers``),
records Events and stores each service's ``scaling_state``.  mypy checks this package
strictly, every module of it.
"""
