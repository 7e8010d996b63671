"""Meridian's Django project: settings, URLs, the ASGI and Celery applications."""

from meridian.celery import app as celery_app

__all__ = ["celery_app"]
