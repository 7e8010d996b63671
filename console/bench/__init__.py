"""Benchmarks run by ``manage.py bench``: each subcommand is a module with ``run(options, stdout)``.

* ``proxy``: the balancer's own cost (throughput ratio to calling the backends
  directly, added time to first token and end to end, its CPU and memory), on a
  loopback stack of zero-compute emulated replicas (``fixture``, ``seed``) driven
  by a separate load-generator process (``loadgen``, ``driver``); ``report``
  turns phases into the table.
"""
