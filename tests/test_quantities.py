"""Quantities and money (``portal/quantities.py``): the one formatter of numbers in messages, Kubernetes
quantities both ways in the portal's units, and amounts of money rounded once."""

from __future__ import annotations

from decimal import Decimal as D

import pytest

from portal.quantities import fmt, format_money, in_portal_units, kube_quantity, parse_quantity, round_money

GPU = "nvidia.com/gpu"


@pytest.mark.parametrize(("value", "text"), [
    (D("12.000"), "12"), (D("0.500"), "0.5"), (D("5E-1"), "0.5"), (D("1E+2"), "100"), (D(0), "0"), (D("-0.000"), "0"),
    (D("0.001"), "0.001"), (4, "4"), ("2.50", "2.5"), (None, "unlimited"),
])
def test_fmt(value, text: str) -> None:
    assert fmt(value) == text


@pytest.mark.parametrize(("text", "value"), [
    ("96", 96), ("500m", D("0.5")), ("2Ti", 2 * 2**40), ("1152Gi", 1152 * 2**30), ("1k", 1000), ("1e3", 1000),
    (" 4 ", 4), ("", 0), (None, 0), (4, 4), (0.1, D("0.1")), (D("2.5"), D("2.5")), ("100M", 10**8), ("250u", D("0.00025")),
])
def test_parse_quantity(text, value) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["lots", "1Zi", "ki", "1ki"])
def test_parse_quantity_refuses_what_is_not_a_quantity(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(bad)


@pytest.mark.parametrize(("resource", "text", "value"), [
    ("memory", "64Gi", 64), ("memory", "1536Mi", D("1.5")), ("memory", str(2**30), 1), ("cpu", "500m", D("0.5")),
    ("cpu", "16", 16), (GPU, "4", 4), ("nvidia.com/total-gpumem", "46068", 46068),
])
def test_in_portal_units(resource: str, text: str, value) -> None:
    assert in_portal_units(resource, text) == value


@pytest.mark.parametrize(("resource", "value", "text"), [
    (GPU, D(4), "4"), (GPU, D("4.000"), "4"), ("cpu", D("0.5"), "500m"), ("cpu", D(96), "96"), ("cpu", D("2.25"), "2250m"),
    ("cpu", "0.5", "500m"), ("memory", D(128), "128Gi"), ("memory", D("0.5"), "512Mi"),
    ("nvidia.com/total-gpumem", D(46068), "46068"), ("nvidia.com/total-gpucores", D("12.5"), "12.5"),
])
def test_kube_quantity(resource: str, value, text: str) -> None:
    assert kube_quantity(resource, value) == text
    assert in_portal_units(resource, text) == D(str(value))  # and back


@pytest.mark.parametrize(("amount", "rounded"), [
    (D("12.345"), D("12.35")), (D("12.344"), D("12.34")), (D("0.005"), D("0.01")), (D("-0.005"), D("-0.01")),
    (7, D("7.00")), ("1.1", D("1.10")), (0.1, D("0.10")),
])
def test_round_money_rounds_half_up_to_the_cent(amount, rounded) -> None:
    assert round_money(amount) == rounded and str(round_money(amount)) == str(rounded)


def test_format_money_rounds_once_and_names_the_currency() -> None:
    assert format_money(D("1234.5"), "EUR") == "1,234.50 EUR"
    assert format_money(D("0.125"), "USD") == "0.13 USD"  # half up, not banker's
    assert format_money(D("0.0049"), "EUR") == "0.00 EUR"  # rounded once: never 0.0049 → 0.005 → 0.01
    assert format_money(D("1E+3"), "CHF") == "1,000.00 CHF"
    assert format_money(D("2"), "") == "2.00"
