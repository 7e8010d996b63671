"""Meridian's Django project: settings, URLs, the ASGI and Celery applications.

The Celery app is not imported here, as the Celery docs' Django layout does, because
every process that reads the settings (each ``manage.py`` command, the console, the
balancers) would then import Celery and its Redis transport for nothing: none of them
sends tasks.  The worker and beat find it themselves: ``celery -A meridian`` looks
for ``meridian.celery`` when this package has no ``app``.  Code that sends a task
(``.delay()``) must import ``meridian.celery`` first, so the task binds to this app
and its broker rather than Celery's default one.
"""
