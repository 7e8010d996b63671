"""Meridian's routing core: pure Python, no framework imports.

The bottom layer of the house (docs/architecture.md): every package above stands on it,
and it imports none of them.  The balancer (``routing``), the simulator (``sim``) and the
benchmarks all run these very objects.
"""
