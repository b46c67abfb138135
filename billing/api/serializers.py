from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from portal.api import DateTimeField, StrictSerializerMixin

from ..models import Discount, Price, Unit, UsageInterval


class PriceSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Price
        fields = ["id", "unit", "key", "amount", "currency", "effective_from", "note", "created_by", "created_at", "updated_at"]
        read_only_fields = fields


class PriceWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    unit = serializers.ChoiceField(choices=Unit.choices)
    key = serializers.CharField(max_length=60, required=False, allow_blank=True, default="",
                                help_text="GPU model (whole GPUs) or MIG profile (slices); empty for the other units.")
    amount = serializers.DecimalField(max_digits=14, decimal_places=6, min_value=Decimal(0))
    currency = serializers.CharField(max_length=3, required=False, help_text="The price list's currency (the default).")
    effective_from = DateTimeField(help_text="Usage from this instant on is priced so; not inside a finalised month.")
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class DiscountSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Discount
        fields = ["id", "tenant", "percent", "effective_from", "note", "created_at"]
        read_only_fields = fields


class DiscountWriteSerializer(StrictSerializerMixin, serializers.Serializer):
    tenant = serializers.CharField(max_length=63, help_text="Tenant slug.")
    percent = serializers.DecimalField(max_digits=5, decimal_places=2, min_value=Decimal(0), max_value=Decimal(100))
    effective_from = DateTimeField()
    note = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class UsageIntervalSerializer(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    project = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    request = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta:
        model = UsageInterval
        fields = ["id", "request", "tenant", "project", "run_key", "source", "object_name", "unit", "key", "quantity",
                  "started_at", "ended_at", "end_reason"]
        read_only_fields = fields
