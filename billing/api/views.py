"""REST API for prices, tenant discounts and usage. Querysets start from selectors; writes go through services,
which refuse who may not (``policy.may_manage_prices``: 403 through ``portal.api.exception_handler``); the views do
not ask again."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from portal.exceptions import Invalid
from tenants.guards import actor_of
from tenants.selectors import tenants_for

from .. import selectors, services
from ..filters import DiscountFilter, PriceFilter, UsageFilter
from ..models import Discount, Price, UsageInterval
from .serializers import (
    DiscountSerializer,
    DiscountWriteSerializer,
    PriceSerializer,
    PriceWriteSerializer,
    UsageIntervalSerializer,
)


class PriceViewSet(mixins.CreateModelMixin, mixins.UpdateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """The price list: every signed-in user reads it; ops add, change and remove prices (never inside a finalised
    month). A price change is a new price with a later ``effective_from``."""

    queryset = Price.objects.none()  # for the OpenAPI schema; get_queryset() scopes
    serializer_class = PriceSerializer
    filterset_class = PriceFilter
    ordering_fields = ["unit", "key", "effective_from", "amount"]
    search_fields = ["key", "note"]
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.prices_for(actor=actor_of(self.request))

    @extend_schema(request=PriceWriteSerializer, responses={201: PriceSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = PriceWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        price = services.price_create(actor=actor, **data.validated_data)
        return Response(PriceSerializer(price).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=PriceWriteSerializer, responses={200: PriceSerializer})
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        price = self.get_object()
        data = PriceWriteSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        price = services.price_update(actor=actor, price=price, **data.validated_data)
        return Response(PriceSerializer(price).data)

    @extend_schema(exclude=True)
    def update(self, request: Request, *args, **kwargs) -> Response:
        return self.partial_update(request, *args, **kwargs)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        price = self.get_object()
        services.price_delete(actor=actor, price=price)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DiscountViewSet(mixins.CreateModelMixin, mixins.DestroyModelMixin, viewsets.ReadOnlyModelViewSet):
    """Tenant discounts (percent, effective-dated): ops set them; a tenant's members read their own."""

    queryset = Discount.objects.none()
    serializer_class = DiscountSerializer
    filterset_class = DiscountFilter
    ordering_fields = ["effective_from", "percent"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def get_queryset(self):
        return selectors.discounts_for(actor=actor_of(self.request))

    @extend_schema(request=DiscountWriteSerializer, responses={201: DiscountSerializer})
    def create(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        data = DiscountWriteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        tenant = tenants_for(actor=actor).filter(slug=values.pop("tenant")).first()
        if tenant is None:
            raise Invalid("No such tenant.", field="tenant")
        discount = services.discount_create(actor=actor, tenant=tenant, **values)
        return Response(DiscountSerializer(discount).data, status=status.HTTP_201_CREATED)

    def destroy(self, request: Request, *args, **kwargs) -> Response:
        actor = actor_of(request)
        discount = self.get_object()
        services.discount_delete(actor=actor, discount=discount)
        return Response(status=status.HTTP_204_NO_CONTENT)


class UsageViewSet(viewsets.ReadOnlyModelViewSet):
    """Usage intervals (what ran, how much of each priced unit, from when to when in the cluster's time) of the
    requests the caller sees; open ones have no ``ended_at``."""

    queryset = UsageInterval.objects.none()
    serializer_class = UsageIntervalSerializer
    filterset_class = UsageFilter
    ordering_fields = ["started_at", "ended_at"]

    def get_queryset(self):
        return selectors.usage_for(actor=actor_of(self.request))
