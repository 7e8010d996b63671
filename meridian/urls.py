from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("routing.urls")),
    path("", include("console.views.urls")),
]
