"""Meridian's routing core: pure Python, no framework imports.

The proxy, the simulator and the benchmarks all run these very objects.
"""
