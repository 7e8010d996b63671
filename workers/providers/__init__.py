"""Cloud providers behind one interface (``base.CloudProvider``).

- ``base``      the interface: launch, terminate, list, price, notices
- ``static``    StaticProvider: operator-registered reserved/on-prem replicas, never
                launched or terminated by Meridian
- ``emulated``  EmulatedCloudProvider: real ``sim.serve`` replica processes after a cold
                start, spot capacity replayed from a trace or a Poisson model
- ``skypilot``  SkyPilotProvider: one SkyPilot cluster per replica on real clouds
                (``docs/skypilot-provider.md``); ``skypilot_plan`` its pure translation,
                ``sky_bridge`` the SDK run in SkyPilot's own environment
- ``factory``   the provider the settings name

Policies never call a provider: the scaling loop's glue (``workers.scaling_glue``)
does.
"""
