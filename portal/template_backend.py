"""Django's template backend, whose render lets go of its context as soon as the page is written.

A Django template context is a reference cycle (each ``ContextDict`` it pushes points back at the context), so
everything a page hands its template (the page's rows, forms, pagers, querysets) outlived the render and was freed
only by the cyclic garbage collector, whose collections then walked it all: a few milliseconds every twenty-odd
pages, one of the pages' p95 (docs/performance.md). Emptying the context's stack after the render breaks the cycle:
the page's objects go when the view returns. The test client's copies of the context keep their own stack.
"""

from __future__ import annotations

from typing import Any

from django.template.backends.django import DjangoTemplates as DjangoBackend, Template as DjangoTemplate, reraise
from django.template.context import make_context
from django.template.exceptions import TemplateDoesNotExist


class Template(DjangoTemplate):
    def render(self, context: dict[str, Any] | None = None, request: Any = None) -> str:
        made = make_context(context, request, autoescape=self.backend.engine.autoescape)
        try:
            return self.template.render(made)
        except TemplateDoesNotExist as exc:
            reraise(exc, self.backend)
        finally:
            made.dicts.clear()


class DjangoTemplates(DjangoBackend):
    """``django.template.backends.django.DjangoTemplates`` with ``Template``."""

    def from_string(self, template_code: str) -> Template:
        return Template(self.engine.from_string(template_code), self)

    def get_template(self, template_name: str) -> Template:
        try:
            return Template(self.engine.get_template(template_name), self)
        except TemplateDoesNotExist as exc:
            reraise(exc, self)
