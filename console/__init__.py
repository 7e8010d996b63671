"""The operator console: pages, WebSocket consumers, the live feed and forms."""
