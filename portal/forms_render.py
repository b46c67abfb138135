"""The form renderer: Django's own (``DjangoTemplates``), with the commonest widgets written in Python.

Every ``{{ field }}`` of a page renders its widget through a template (an ``<input>``, a ``<select>`` with one
include per option, the attributes through a loop of their own): a select of ten options cost several milliseconds
on a loaded machine, and the filter forms, the decision forms and the quota forms are on most pages
(docs/performance.md). ``FastTemplates`` writes the same HTML, character for character, for the widgets whose
template is Django's own ``input.html`` family, ``textarea.html`` and ``select.html`` with ``select_option.html``,
and nothing for an empty error list (every ``{{ field.errors }}`` of a form without errors rendered two templates);
every value goes through what the template would do with it (``render_value_in_context``: local time,
localisation, escaping; ``stringformat:'s'``). Any other template, an app's override of one of these, or an option
with a template of its own is rendered by the template as before. ``tests/test_forms_render.py`` compares both
ways for every widget it takes over, bound and unbound, and for the decision and tenant quota forms.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import django
from django.forms.renderers import DjangoTemplates
from django.utils.formats import localize
from django.utils.functional import cached_property
from django.utils.html import conditional_escape
from django.utils.safestring import SafeData, mark_safe
from django.utils.timezone import template_localtime

WIDGETS = "django/forms/widgets/"
OPTION = WIDGETS + "select_option.html"
# Django's widget templates that are nothing but ``{% include "django/forms/widgets/input.html" %}``.
INPUTS = ("checkbox", "color", "date", "datetime", "email", "file", "hidden", "number", "password", "search", "tel",
          "text", "time", "url", "input")
DJANGO_TEMPLATES = Path(django.__file__).parent / "forms" / "templates"
# An error list (``{{ form.errors }}``, ``{{ field.errors }}``): ``default.html`` is nothing but an include of ``ul.html``.
ERROR_LISTS = ("django/forms/errors/list/default.html", "django/forms/errors/list/ul.html")


def _out(value: Any) -> str:
    """``{{ value }}`` in an autoescaping template (``render_value_in_context`` with the context's defaults)."""
    value = localize(template_localtime(value))
    if not issubclass(type(value), str):
        value = str(value)
    return conditional_escape(value)


def _s(value: Any) -> str:
    """``{{ value|stringformat:'s' }}``: the filter is ``is_safe``, so safe data stays unescaped."""
    formatted = str(value) if isinstance(value, tuple) else value
    try:
        out = "%s" % (formatted,)  # noqa: UP031 exactly what Django's stringformat filter does
    except (ValueError, TypeError):
        out = ""
    if isinstance(value, SafeData):
        out = mark_safe(out)
    return _out(out)


def _attrs(attrs: Mapping[str, Any]) -> str:
    """``django/forms/widgets/attrs.html``."""
    parts = []
    for name, value in attrs.items():
        if value is not False:
            parts.append(" " + _out(name))
            if value is not True:
                parts.append('="' + _s(value) + '"')
    return "".join(parts)


def _input(widget: Mapping[str, Any]) -> str:
    value = widget["value"]
    shown = ' value="' + _s(value) + '"' if value != None else ""  # the template compares with ``!= None``
    return f'<input type="{_out(widget["type"])}" name="{_out(widget["name"])}"{shown}{_attrs(widget["attrs"])}>'


def _textarea(widget: Mapping[str, Any]) -> str:
    value = widget["value"]
    return (f'<textarea name="{_out(widget["name"])}"{_attrs(widget["attrs"])}>\n'
            f'{_out(value) if value else ""}</textarea>')


def _select(widget: Mapping[str, Any]) -> str | None:
    out = [f'<select name="{_out(widget["name"])}"{_attrs(widget["attrs"])}>']
    for group_name, group_choices, _index in widget["optgroups"]:
        if group_name:
            out.append(f'\n  <optgroup label="{_out(group_name)}">')
        for option in group_choices:
            if option["template_name"] != OPTION:
                return None
            # The option's include keeps its template's final newline.
            out.append(f'\n  <option value="{_s(option["value"])}"{_attrs(option["attrs"])}>{_out(option["label"])}</option>\n')
        if group_name:
            out.append("\n  </optgroup>")
    out.append("\n</select>")
    return "".join(out)


class FastTemplates(DjangoTemplates):
    """``DjangoTemplates`` with the input, textarea and select widgets written in Python (same HTML)."""

    @cached_property
    def _fast(self) -> dict[str, Callable[[Mapping[str, Any]], str | None]]:
        candidates: dict[str, Callable[[Mapping[str, Any]], str | None]] = {
            WIDGETS + f"{name}.html": _input for name in INPUTS}
        candidates[WIDGETS + "textarea.html"] = _textarea
        candidates[WIDGETS + "select.html"] = _select
        used = {*candidates, WIDGETS + "input.html", WIDGETS + "attrs.html", OPTION}
        # Only while every template involved is Django's own: an app that overrides one keeps its template.
        if any(Path(self.engine.get_template(name).origin.name).parent.parent.parent.parent != DJANGO_TEMPLATES
               for name in used):
            return {}
        return candidates

    @cached_property
    def _own_error_lists(self) -> bool:
        """Whether the error list templates are Django's own (then an empty list writes nothing)."""
        return all(Path(self.engine.get_template(name).origin.name).parent.parent.parent.parent.parent == DJANGO_TEMPLATES
                   for name in ERROR_LISTS)

    def render(self, template_name: str, context: dict[str, Any], request: Any = None) -> str:
        if template_name in ERROR_LISTS and not context.get("errors") and self._own_error_lists:
            return ""  # ``{{ field.errors }}`` of a field without errors: ul.html's ``{% if errors %}`` writes nothing
        fast = self._fast.get(template_name)
        widget = context.get("widget") if fast is not None else None
        if widget is not None:
            html = fast(widget)
            if html is not None:
                return html
        return super().render(template_name, context, request=request)
