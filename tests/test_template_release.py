"""A page's objects are freed when its render returns, not when the cyclic garbage collector next comes by: Django's
template context is a reference cycle (portal/template_backend.py empties it after the render) and so is a Jinja2
context with a macro defined in it (``portal.jinja_env.render_released`` empties it). With the collector off, what
the page handed its template is gone as soon as nothing else refers to it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
from django.template import engines
from django.test import RequestFactory

from portal import jinja_env


class Row:
    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return self.name


@pytest.fixture
def no_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_a_django_page_lets_go_of_its_objects(no_collector) -> None:
    row = Row("a & b")
    gone = weakref.ref(row)
    page = engines["django"].from_string("{% for r in rows %}<li>{{ r }}</li>{% endfor %}{% with x=1 %}{{ x }}{% endwith %}")
    assert page.render({"rows": [row]}, request=RequestFactory().get("/")) == "<li>a &amp; b</li>1"  # as a view renders
    del row
    assert gone() is None


def test_a_jinja2_render_with_a_macro_lets_go_of_its_objects(no_collector) -> None:
    row = Row("a & b")
    gone = weakref.ref(row)
    # A macro that reads the template's context (as the rows' macros read the globals) refers back to it.
    template = engines["jinja2"].from_string("{% macro m(r) %}<li>{{ r }}{{ end }}</li>{% endmacro %}{{ m(row) }}").template
    assert jinja_env.render_released(template, {"row": row, "end": "."}) == "<li>a &amp; b.</li>"
    del row
    assert gone() is None


def test_a_jinja2_error_still_says_where(no_collector) -> None:
    template = engines["jinja2"].from_string("{{ 1 // zero }}").template
    with pytest.raises(ZeroDivisionError):
        jinja_env.render_released(template, {"zero": 0})
