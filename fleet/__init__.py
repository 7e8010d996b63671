"""Meridian's data layer: the fleet's topology, configuration and history as Django models.

It stands only on the pure core below it, the package ``core`` (``fleet.models`` takes the
vocabulary of a key's limits, ``KeyLimits`` and its budget periods, from
``core.key_limits``).  Every package above stands on this one (the balancer reads
topology snapshots, the control plane writes states and events, the console shows them);
it imports none of them.  The layers: docs/architecture.md, held by tests/test_layers.py.
"""
