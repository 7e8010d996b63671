"""The balancer's HTTP endpoints, one module per feature: completions (the OpenAI
proxy), ops (models, health, metrics) and internal (peer availability, state)."""
