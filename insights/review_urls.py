"""The architecture review's pages (insights/review_views.py); its API is in insights/review_api_urls.py."""

from django.urls import path

from . import review_views

urlpatterns = [
    path("ops/architecture-review/", review_views.ops_architecture_review, name="ops-architecture-review"),
    path("tenants/<slug:slug>/architecture-review/", review_views.tenant_architecture_review,
         name="tenant-architecture-review"),
]
