"""Replaying workloads against an OpenAI-compatible endpoint (``manage.py replay``).

``service.run_replay`` is the entry point; ``runner.ReplayRunner`` the engine, a
plain asyncio class that takes any ``Sender`` so it can be tested without a
network; ``sender.OpenAISender`` speaks to the endpoint with the official SDK.
"""
