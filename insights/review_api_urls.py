from django.urls import path

from . import review_views

urlpatterns = [
    path("architecture-review/", review_views.ArchitectureReviewView.as_view(), name="architecture-review"),
]
