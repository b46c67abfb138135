"""The Jinja2 rows' ``floatformat`` (``portal.jinja_env``) is Django's, remembered per number, argument and language:
it writes what Django writes for every kind and spelling of a number, and follows a setting changed after a figure
was written (docs/performance.md)."""

from __future__ import annotations

from decimal import Decimal

from django.template import engines
from django.template.defaultfilters import floatformat
from django.utils import translation

VALUES = [0, 7, -3, 12000, 0.0, -0.0, 1.5, 2.675, 1e-7, 1234567.891, float("nan"), float("inf"),
          Decimal("1"), Decimal("1.0"), Decimal("1.00"), Decimal("-0.00"), Decimal("2.675"), Decimal("1234567.5"),
          "3.25", "", None, "x", True]
ARGS = [-1, "-2", 2, "0", "2g", "-3u", 3]


def _jinja() -> object:
    return engines["jinja2"].env.filters["floatformat"]


def test_writes_what_django_writes() -> None:
    ours = _jinja()
    assert ours is not floatformat  # the remembering one
    for _ in range(2):  # the second time from what was kept
        for value in VALUES:
            for arg in ARGS:
                assert str(ours(value, arg)) == str(floatformat(value, arg)), (value, arg)
    assert str(ours(Decimal("1.00"), 2)) == str(ours(Decimal("1.0"), 2)) == "1.00"


def test_follows_settings_and_language(settings) -> None:
    ours = _jinja()
    assert str(ours(1234567.5, "2g")) == str(floatformat(1234567.5, "2g"))
    settings.USE_THOUSAND_SEPARATOR = True
    settings.NUMBER_GROUPING = 3
    settings.THOUSAND_SEPARATOR = "'"
    assert str(ours(1234567.5, "2g")) == str(floatformat(1234567.5, "2g"))
    with translation.override("de"):
        assert str(ours(1.5, 2)) == str(floatformat(1.5, 2))
    assert str(ours(1.5, 2)) == str(floatformat(1.5, 2))
