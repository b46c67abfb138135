from django.urls import path

from . import ops_views, views

urlpatterns = [
    path("requests/", views.request_list, name="request-list"),
    path("requests/new/", views.request_new, name="request-new"),
    path("requests/presets/<int:pk>/delete/", views.request_preset_delete, name="request-preset-delete"),
    path("requests/<int:pk>/", views.request_detail, name="request-detail"),
    path("requests/<int:pk>/logs/", views.request_logs, name="request-logs"),
    path("requests/<int:pk>/logs/follow/", views.request_logs_follow, name="request-logs-follow"),
    path("requests/<int:pk>/logs/download/", views.request_logs_download, name="request-logs-download"),
    path("notebooks/auth/", views.notebook_auth, name="notebook-auth"),
    path("notebooks/<int:pk>/", views.notebook_proxy, name="notebook-proxy"),
    path("notebooks/<int:pk>/<path:rest>", views.notebook_proxy, name="notebook-proxy-path"),
    path("requests/<int:pk>/decide/", views.request_decide, name="request-decide"),
    path("requests/<int:pk>/cancel/", views.request_cancel, name="request-cancel"),
    path("requests/<int:pk>/stop/", views.request_stop, name="request-stop"),
    path("requests/<int:pk>/restart/", views.request_restart, name="request-restart"),
    path("requests/<int:pk>/delete/", views.request_delete, name="request-delete"),
    path("requests/<int:pk>/extend/", views.request_extend, name="request-extend"),
    path("requests/<int:pk>/scale/", views.request_scale, name="request-scale"),
    path("approvals/", views.approvals, name="approvals"),
    path("ops/requests/", views.ops_requests, name="ops-requests"),
    path("ops/templates/", ops_views.template_list, name="ops-templates"),
    path("ops/templates/new/", ops_views.template_new, name="ops-template-new"),
    path("ops/templates/<int:pk>/", ops_views.template_detail, name="ops-template"),
    path("ops/images/", ops_views.image_list, name="ops-images"),
    path("ops/images/new/", ops_views.image_new, name="ops-image-new"),
    path("ops/images/<int:pk>/", ops_views.image_detail, name="ops-image"),
]
