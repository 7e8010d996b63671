"""Benchmarks run by ``manage.py bench``: each subcommand is a module with ``run(options, stdout)``.

* ``proxy``: the balancer's own cost (throughput ratio to calling the backends
  directly, added time to first token and end to end, its CPU and memory), on a
  loopback stack of zero-compute emulated replicas (``fixture``, ``seed``) driven
  by a separate load-generator process (``loadgen``, ``driver``); ``report``
  turns phases into the table.
* ``routing``: the cost of one routing decision per policy, prompt size and target
  count, tokenization and block hashing per 8k tokens, and the memory of the prefix
  structures at their bounds, all in process on the routing core's own objects.
"""
