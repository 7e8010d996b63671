"""The balancer's HTTP endpoints, one module per feature: completions (the OpenAI
proxy) and ops (models, health, metrics, internal state)."""
