from django.urls import path

from console.views.overview import overview

urlpatterns = [
    path("", overview, name="overview"),
]
