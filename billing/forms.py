"""Ops forms for the price list. They shape and check input; the views hand the cleaned data to
``billing.services`` (``price_create``/``price_update``), whose refusals are shown next to their fields."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import forms
from django.utils import timezone

from portal.forms import DecimalField

from .models import Price, Unit

DATETIME_FORMATS = ["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d"]


class PriceForm(forms.Form):
    unit = forms.ChoiceField(choices=Unit.choices)
    key = forms.CharField(max_length=60, required=False, label="GPU model or MIG profile",
                          help_text="Whole GPUs: the GPU model (e.g. h100-80gb); MIG: the profile (e.g. 1g.10gb); else empty.")
    amount = DecimalField(label="Price per unit", min_value=Decimal(0), max_digits=14, decimal_places=6)
    effective_from = forms.DateTimeField(
        label="Effective from", input_formats=DATETIME_FORMATS,
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}, format="%Y-%m-%dT%H:%M"),
        help_text="Usage from this instant on is priced so. Not inside a finalised month.",
    )
    note = forms.CharField(max_length=200, required=False)

    def __init__(self, *args: Any, price: Price | None = None, currency: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("prefix", "price")
        if price is not None and "initial" not in kwargs:
            kwargs["initial"] = {name: getattr(price, name) for name in ("unit", "key", "amount", "effective_from", "note")}
        elif "initial" not in kwargs:
            kwargs["initial"] = {"effective_from": timezone.now().replace(second=0, microsecond=0)}
        super().__init__(*args, **kwargs)
        self.fields["amount"].label = f"Price per unit ({currency})" if currency else "Price per unit"
        self.fields["effective_from"].label = f"Effective from ({timezone.get_current_timezone_name()})"
