"""The Jinja2 pages' ``linebreaksbr`` and their dates in local time (``portal.jinja_env``) write what Django's engine
writes; the time zone is read once per request (``portal.per_request``) and a zone activated before the request is
the one its dates are written in."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone as fixed_zone
from zoneinfo import ZoneInfo

import pytest
from django.core.signals import request_finished, request_started
from django.template import engines
from django.template.defaultfilters import linebreaksbr
from django.utils import timezone
from django.utils.functional import lazy
from django.utils.safestring import mark_safe

from portal.per_request import once

TEXTS = ["", "plain", "two\nlines", "crlf\r\nand cr\rand lf\n", "<b>bold</b> & 'quotes' \"double\"", "tab\tand é ü 中",
         "\n\n", "trailing\r", "a < b > c & d", mark_safe("<i>kept</i>\nas is"), 42, None, 1.5,
         lazy(lambda: "lazy <x>\nline", str)()]


def _render(source: str, **values: object) -> str:
    return engines["jinja2"].from_string(source).render(values)


def test_linebreaksbr_writes_what_django_writes() -> None:
    for text in TEXTS:
        assert _render("{{ t|linebreaksbr }}", t=text) == str(linebreaksbr(text, autoescape=True)), repr(text)


def test_dates_are_written_in_the_zone_active_when_the_request_began(settings, db) -> None:
    settings.USE_TZ = True
    when = datetime(2026, 12, 4, 23, 30, tzinfo=UTC)
    template = "{{ d|stamp }} {{ d|day }}"
    assert _render(template, d=when) == "2026-12-04 23:30 2026-12-04"  # outside a request: looked up each time
    with timezone.override(ZoneInfo("Asia/Kolkata")):
        assert _render(template, d=when) == "2026-12-05 05:00 2026-12-05"
        request_started.send(sender=None)
        try:
            assert _render(template, d=when) == "2026-12-05 05:00 2026-12-05"
            assert _render(template, d=when.astimezone(fixed_zone(timedelta(hours=-5)))) == "2026-12-05 05:00 2026-12-05"
        finally:
            request_finished.send(sender=None)
    request_started.send(sender=None)
    try:
        assert _render(template, d=when) == "2026-12-04 23:30 2026-12-04"  # a new request reads the zone again
    finally:
        request_finished.send(sender=None)


def test_naive_dates_and_other_values_go_to_django() -> None:
    assert _render("{{ d|stamp }}", d=datetime(2026, 1, 2, 3, 4)) == "2026-01-02 03:04"
    assert _render("{{ d|stamp }}", d=None) == ""


@pytest.mark.parametrize("inside", [False, True])
def test_once_looks_up_once_per_request_and_every_time_outside(inside: bool, db) -> None:
    calls: list[int] = []

    def look_up() -> int:
        calls.append(1)
        return len(calls)

    if inside:
        request_started.send(sender=None)
    try:
        answers = [once("test-value", look_up) for _ in range(3)]
    finally:
        if inside:
            request_finished.send(sender=None)
    assert answers == ([1, 1, 1] if inside else [1, 2, 3])
    assert once("test-value", look_up) == len(calls)  # after the request: looked up again


@pytest.mark.parametrize("zone", ["UTC", "Europe/Berlin", "America/New_York"])
def test_both_engines_name_the_zone_they_write_dates_in(settings, zone) -> None:
    settings.TIME_ZONE = zone
    when = datetime(2026, 12, 4, 23, 30, tzinfo=UTC)
    local = when.astimezone(ZoneInfo(zone))
    expected = f"{local:%Y-%m-%d %H:%M} {zone}"
    assert _render("{{ d|stamp }} {{ zone() }}", d=when) == expected
    assert engines["django"].from_string("{% load page_kit %}{{ d|stamp }} {% zone %}").render({"d": when}) == expected
