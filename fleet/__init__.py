"""Meridian's data layer: the fleet's topology, configuration and history as Django models.

Every other package stands on this one (the balancer reads topology snapshots, the
control plane writes states and events, the console shows them); it imports none of
them.
"""
