"""The architecture review: the ops page (the whole platform), a tenant admin's page (their tenant's parts) and
``GET /api/v1/architecture-review/``. Reads go through ``review_selectors``; the answers are ``review.review()``.

Ops page: 404 for everyone but ops. Tenant page: 404 for a tenant the actor cannot see, 403 for one they see but do
not administer (``tenants.guards.tenant_to_manage_members``). The API answers the same with ``?tenant=<slug>``;
without it, ops get the platform and a tenant admin their one tenant (several: ``tenant`` is required).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.urls import NoReverseMatch, reverse
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal.api import StrictSerializerMixin
from portal.exceptions import Invalid, NotAllowed
from tenants.guards import actor_of, ops_only, tenant_to_manage_members
from tenants.selectors import admin_tenants_for
from tenants.ui import page

from .review import QUESTIONS, as_data, review
from .review_selectors import review_snapshot_for

# The maintenance app's MIG changes page, when it is installed (another app's URL: looked up, not assumed).
MIG_CHANGES_URL_NAMES = ("ops-mig-changes", "mig-changes", "maintenance:mig-changes")


def mig_changes_url(actor: Any) -> str:
    if not actor.is_ops:
        return ""  # an ops page: a tenant admin is told who does it, not given a link that answers 404
    for name in MIG_CHANGES_URL_NAMES:
        try:
            return reverse(name)
        except NoReverseMatch:
            continue
    return ""


@login_required
def ops_architecture_review(request: HttpRequest) -> HttpResponse:
    actor = ops_only(request)
    snapshot = review_snapshot_for(actor=actor, mig_changes_url=mig_changes_url(actor))
    return page(request, "insights/architecture_review.html", {
        "tab": "architecture-review", "snapshot": snapshot, "answers": review(snapshot), "tenant": None,
        "ops_capacity_section": True,  # base.html: the cluster side is under "Capacity"
    })


@login_required
def tenant_architecture_review(request: HttpRequest, slug: str) -> HttpResponse:
    actor = actor_of(request)
    tenant = tenant_to_manage_members(actor, slug)
    snapshot = review_snapshot_for(actor=actor, tenant=tenant, mig_changes_url=mig_changes_url(actor))
    return page(request, "insights/architecture_review.html", {
        "tab": "architecture-review", "snapshot": snapshot, "answers": review(snapshot), "tenant": tenant,
    })


# ------------------------------------------------------------------------------------------------ API
class ReviewQuery(StrictSerializerMixin, serializers.Serializer):
    tenant = serializers.SlugField(required=False, help_text="A tenant you administer: its parts of the review only.")


class AnswerSerializer(serializers.Serializer):
    key = serializers.ChoiceField(choices=list(QUESTIONS))
    question = serializers.CharField()
    answer = serializers.CharField()
    details = serializers.ListField(child=serializers.CharField())


class ReviewClusterSerializer(serializers.Serializer):
    name = serializers.CharField()
    architecture = serializers.CharField()
    architecture_label = serializers.CharField()
    health = serializers.CharField()


class ReviewSerializer(serializers.Serializer):
    tenant = serializers.CharField(allow_null=True, help_text="The tenant reviewed; null: the whole platform.")
    clusters = ReviewClusterSerializer(many=True)
    answers = AnswerSerializer(many=True)


class ArchitectureReviewView(APIView):
    """The architecture review checklist answered from the live configuration: resource units and why, isolation,
    governed objects, admission and quota, reconfiguration, usage metering, failure domains."""

    @extend_schema(parameters=[ReviewQuery], responses={200: ReviewSerializer})
    def get(self, request: Request) -> Response:
        actor = actor_of(request)
        query = ReviewQuery(data=request.query_params)
        query.is_valid(raise_exception=True)
        slug = query.validated_data.get("tenant")
        tenant = None
        if slug:
            tenant = tenant_to_manage_members(actor, slug)
        elif not actor.is_ops:
            mine = list(admin_tenants_for(actor=actor)[:2])
            if not mine:
                raise NotAllowed("Only tenant admins and platform ops read the architecture review.")
            if len(mine) > 1:
                raise Invalid("You administer several tenants: say which.", field="tenant")
            tenant = mine[0]
        snapshot = review_snapshot_for(actor=actor, tenant=tenant, mig_changes_url=mig_changes_url(actor))
        return Response(ReviewSerializer(as_data(snapshot, review(snapshot))).data)
