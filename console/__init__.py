"""Meridian's Django project and operator console."""

from console.celery import app as celery_app

__all__ = ["celery_app"]
