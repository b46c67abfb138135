"""The Jinja2 environment of the hot pages (``TEMPLATES``' second engine, templates/jinja2/).

A list's rows (the approvals inbox, the quota request cards and rows, the capacity page's node rows), the hottest
pages' whole bodies (the capacity page, the quota requests page) and the partials they share with other pages (a
form and its fields, the filters form, the pagination, a chart, the "in use as of" line, a cluster's health, the
capacity section's tabs) are Jinja2 templates: compiled to Python once, they cost a fraction of what Django's engine
spends walking its nodes (docs/performance.md). So is the page frame (``frame.html``: head, navigation, messages,
footer), which Django's ``base.html`` writes around a page's blocks with ``{% jinja_frame %}``; a page writes
rows with ``{% jinja "name.html" key=value %}`` and a whole body with ``{% jinja_body "name.html" %}``
(``tenants/templatetags/page_kit.py``); a shared partial's Django include of the same name is one line that writes
the Jinja2 template. An htmx answer renders the same template (``render(request, name, context, using="jinja2")``).
One template per output, nothing written twice.

What the templates may call, with the same names as in Django templates:

- every filter of the project's template libraries (``{% load %}`` names: ``stamp``, ``day``, ``qty``, ``money``,
  ``state_badge``, ``display``: ``r|display("status")`` for ``r.get_status_display()``, …) and Django's built-in ones (``floatformat``, ``pluralize``, ``linebreaksbr``, ``lower``…),
  given local time where Django's engine would convert (``expects_localtime``) and autoescaping where they ask;
- every simple tag of those libraries as a function (``url_kept('quota-request', r.pk)``, ``quota_asked(r)``,
  ``may('quotas.may_decide', r, tier=r.approver)``); a tag that takes the context gets Jinja2's, which answers
  ``get("request")`` as Django's does;
- ``url(name, *args)`` (Django's ``reverse``), ``static(path)``; the backend adds ``request``, ``csrf_input`` and
  ``csrf_token``.

The libraries are read from the Django engine when the environment is made, so this module imports no app.
"""

from __future__ import annotations

import html
import inspect
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.signals import setting_changed
from django.template import engines
from django.template.defaultfilters import linebreaksbr as _django_linebreaksbr, register as builtin_filters
from django.templatetags.static import static
from django.urls import reverse
from django.utils.html import conditional_escape
from django.utils.timezone import get_current_timezone, template_localtime
from django.utils.translation import get_language
from jinja2 import Environment, Template, pass_context
from markupsafe import Markup

from .per_request import once


def url(name: str, *args: Any) -> str:
    return reverse(name, args=args or None)


def _localtime(value: Any) -> Any:
    """``template_localtime(value)``, in the time zone of the request read once per request (``portal.per_request``:
    the zone's context-local read cost more than the conversion and the formatting together, and a list writes a
    few dates a row)."""
    if type(value) is datetime and value.utcoffset() is not None and settings.USE_TZ:
        return value.astimezone(once("time zone", get_current_timezone))
    return template_localtime(value)


def _filter(func: Any) -> Any:
    """A Django filter as Jinja2 calls it: local time first where Django's engine converts; autoescaping on."""
    if getattr(func, "expects_localtime", False):
        inner = func

        def func(value: Any, *args: Any, _inner: Any = inner) -> Any:
            return _inner(_localtime(value), *args)
    if getattr(func, "needs_autoescape", False):
        inner = func

        def func(value: Any, *args: Any, _inner: Any = inner) -> Any:
            return _inner(value, *args, autoescape=True)
    return func


_KEPT_MOST = 4096


def _kept_numbers(func: Any) -> Any:
    """Django's ``floatformat`` remembered per number, argument and language (forgotten when a setting changes): the
    approvals inbox writes the same few quota figures three times a row, 13 µs each through ``Decimal``. Its output
    depends on the number's value, not on how it is written (``Decimal("1.0")`` and ``Decimal("1.00")`` give the same);
    anything but an int, a float or a Decimal goes to Django's each time."""
    kept: dict[tuple[Any, ...], Any] = {}

    def floatformat(value: Any, arg: Any = -1) -> Any:
        kind = type(value)
        if kind is not int and kind is not float and kind is not Decimal:
            return func(value, arg)
        key = (kind, value, arg, get_language())
        found = kept.get(key)
        if found is None:
            if len(kept) >= _KEPT_MOST:
                kept.clear()
            found = kept[key] = func(value, arg)
        return found

    setting_changed.connect(lambda **kwargs: kept.clear(), weak=False)
    return floatformat


def _kept_static() -> Any:
    """``static(path)`` remembered per path (forgotten when a setting changes): the frame writes five on every page,
    each a storage lookup and a ``urljoin``; a file's URL does not change while the process runs (the manifest, when
    there is one, is read once too)."""
    kept: dict[str, str] = {}

    def kept_static(path: str) -> str:
        found = kept.get(path)
        if found is None:
            if len(kept) >= _KEPT_MOST:
                kept.clear()
            found = kept[path] = static(path)
        return found

    setting_changed.connect(lambda **kwargs: kept.clear(), weak=False)
    return kept_static


def _linebreaksbr(value: Any) -> Any:
    """Django's ``linebreaksbr`` with autoescaping (the same text) for a plain string, without its lazy-text wrappers
    and regex: 25 µs a call on a small machine, most of a quota request card's reason; a safe or lazy string, or
    anything else, goes to Django's."""
    if type(value) is not str:
        return _django_linebreaksbr(value, autoescape=True)
    return Markup(html.escape(value.replace("\r\n", "\n").replace("\r", "\n")).replace("\n", "<br>"))


def _tag(compiled: Any) -> Any:
    """A simple tag's own function (``None`` for an inclusion tag or a tag of another kind)."""
    func = getattr(compiled, "__wrapped__", None)
    if func is None or "filename" in compiled.__code__.co_freevars:
        return None
    params = list(inspect.signature(func).parameters)
    return pass_context(func) if params and params[0] == "context" else func


def render_released(template: Template, values: dict[str, Any]) -> str:
    """``template.render(values)``, then its context emptied: a context that a macro imported with it refers back to
    is a reference cycle, which would keep everything the page handed the template (its rows, pagers, forms) until
    the cyclic garbage collector came by (portal/template_backend.py says why that matters)."""
    context = template.new_context(values)
    try:
        return template.environment.concat(template.root_render_func(context))  # type: ignore[attr-defined]
    except Exception:
        template.environment.handle_exception()
    finally:
        context.vars.clear()
        context.parent.clear()


def environment(**options: Any) -> Environment:
    env = Environment(**options)
    env.filters.update({name: _filter(f) for name, f in builtin_filters.filters.items() if name not in env.filters})
    env.filters["floatformat"] = _kept_numbers(env.filters["floatformat"])
    env.filters["linebreaksbr"] = _linebreaksbr
    django_engine = engines["django"].engine
    ours = {config.name for config in apps.get_app_configs() if Path(config.path).is_relative_to(settings.BASE_DIR)}
    for label, library in django_engine.template_libraries.items():
        if django_engine.libraries[label].split(".", 1)[0] not in ours:
            continue  # Django's, DRF's, the admin's: not the pages'
        env.filters.update({name: _filter(f) for name, f in library.filters.items()})
        for name, compiled in library.tags.items():
            func = _tag(compiled)
            if func is not None:
                env.globals[name] = func
    # ``{{ value }}`` as Django's engine escapes it (``'`` as ``&#x27;``, MarkupSafe writes ``&#39;``; a safe string
    # kept): the form includes' labels and help texts (templates/jinja2/includes/), the same HTML as Django's.
    env.filters["dj"] = conditional_escape
    env.globals.update(url=url, static=_kept_static())
    return env
