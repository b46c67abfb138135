from django.urls import path

from . import views

urlpatterns = [
    path("ops/prices/", views.price_list, name="ops-prices"),
    path("ops/prices/new/", views.price_new, name="ops-price-new"),
    path("ops/prices/<int:pk>/", views.price_detail, name="ops-price"),
    path("ops/prices/<int:pk>/delete/", views.price_delete, name="ops-price-delete"),
]
