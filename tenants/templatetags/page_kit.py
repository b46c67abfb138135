"""What pages write many times, cheaper than Django's own tags and filters, with the same output.

``{% jinja "name.html" key=value %}``: a list's rows (or one row) written by a Jinja2 template of templates/jinja2/
(``portal/jinja_env.py``): the page's request, CSRF token and the values named; nothing else of the page's context.

``{% url_kept %}`` and ``{% url_if %}``: ``{% url %}`` for the URLs a page writes many times (the navigation's, a
link per row of a list). ``|stamp`` and ``|day``: ``|date:"Y-m-d H:i"`` and ``|date:"Y-m-d"``. ``written``:
``{{ value }}`` for the rows that tags write out in Python. ``|display:"state"`` (Jinja2: ``|display("state")``):
``get_state_display()``, a tenth of its cost (the field's choices made a dict once).

Django reverses a name every time (its patterns tried, the result checked against them): a tenth of a list page
went to it. Here a name without arguments is reversed once per URLconf and script prefix, and a name with one id
or slug once with a marker in its place, each row's value put where the marker was (docs/performance.md). A
value the marker cannot stand for (not an ``int``, not a plain slug) is reversed as usual; so is a name whose
pattern does not take the marker. (A pattern narrower than a slug that takes the marker would get a link where
``{% url %}`` would refuse the value; the portal's patterns take ``<int:...>`` and ``<slug:...>``.)
"""

from __future__ import annotations

import html
import re
from datetime import datetime
from typing import Any

from django import template
from django.conf import settings
from django.template import engines
from django.template.base import render_value_in_context
from django.template.defaultfilters import date as date_filter
from django.middleware.csrf import get_token
from django.urls import NoReverseMatch, get_script_prefix, get_urlconf, reverse
from django.utils.encoding import force_str
from django.utils.hashable import make_hashable
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.timezone import get_current_timezone_name
from django.utils.translation import get_language

from portal import jinja_env
from portal.per_request import once

register = template.Library()

_ID_MARK = 918273645
_SLUG_MARK = "zq9slug0mark"
_SLUG = re.compile(r"[-a-zA-Z0-9_]+\Z")
_MISSING = object()
_URLS: dict[tuple[Any, ...], Any] = {}


def _urls_here() -> tuple[str, str]:
    return get_urlconf() or settings.ROOT_URLCONF, get_script_prefix()


def _where() -> tuple[str, str]:
    """The URLconf and script prefix URLs are reversed under: looked up once per request (each lookup reads two
    context-local values, about a twentieth of a page of links; ``portal.per_request``), on every call outside one."""
    return once("urls", _urls_here)


def _kept(name: str, kind: str) -> tuple[str, str] | str | None:
    """The URL of ``name`` ("" kind: no argument), or its (head, tail) around the marker of ``kind``; None when
    the marker does not fit the pattern (then every call reverses)."""
    key = (name, kind, *_where())
    kept = _URLS.get(key, _MISSING)
    if kept is _MISSING:
        if kind == "":
            kept = reverse(name)  # NoReverseMatch: not kept, raised as {% url %} raises it
        else:
            mark = _ID_MARK if kind == "id" else _SLUG_MARK
            try:
                head, found, tail = reverse(name, args=[mark]).partition(str(mark))
            except NoReverseMatch:
                found = ""
            kept = (head, tail) if found else None
        _URLS[key] = kept
    return kept


def url_kept(name: str, *args: Any) -> str:
    """``reverse(name, args=args)``, reversed once per name (and kind of argument) instead of once per call."""
    if not args:
        return _kept(name, "")
    if len(args) == 1:
        value = args[0]
        if type(value) is int:
            kind, text = "id", str(value)
        elif isinstance(value, str) and _SLUG.match(value):
            kind, text = "slug", value
        else:
            kind = text = ""
        if kind:
            parts = _kept(name, kind)
            if parts is not None:
                return f"{parts[0]}{text}{parts[1]}"
    return reverse(name, args=list(args))


@register.simple_tag(name="url_kept")
def url_kept_tag(name: str, *args: Any) -> str:
    """``{% url name arg %}`` (one id or slug, or none): see the module."""
    return url_kept(name, *args)


@register.simple_tag
def url_if(name: str, *args: Any) -> str:
    """``{% url name arg as var %}`` of a name that may not exist (an app not installed): its URL (kept as
    ``url_kept`` keeps it), or ""."""
    try:
        return url_kept(name, *args)
    except NoReverseMatch:
        return ""


@register.simple_tag
def zone() -> str:
    """The name of the time zone the pages write dates in, said after a date: ``TIME_ZONE`` ("UTC" unless set), or
    a zone a middleware activated. Read once per request (``portal.per_request``)."""
    return once("time zone name", get_current_timezone_name)


@register.filter(expects_localtime=True, is_safe=False)
def stamp(value: Any) -> str:
    """``|date:"Y-m-d H:i"`` (a datetime in local time, as the engine gives it to the filter), without formatting
    through Django's format strings (a tenth of a millisecond each, a row of a list pays several)."""
    if type(value) is datetime:
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d} {value.hour:02d}:{value.minute:02d}"
    return date_filter(value, "Y-m-d H:i")


@register.filter(expects_localtime=True, is_safe=False)
def iso(value: Any) -> str:
    """``|date:"c"`` (ISO 8601 in local time, a ``<time datetime>``), as ``stamp``: the datetime's own ``isoformat``,
    which is what Django's "c" format writes."""
    if type(value) is datetime:
        return value.isoformat()
    return date_filter(value, "c")


@register.filter(expects_localtime=True, is_safe=False)
def day(value: Any) -> str:
    """``|date:"Y-m-d"``, as ``stamp``."""
    if type(value) is datetime:
        return f"{value.year:04d}-{value.month:02d}-{value.day:02d}"
    return date_filter(value, "Y-m-d")


_LABELS: dict[Any, dict[Any, Any]] = {}


@register.filter
def display(obj: Any, name: str) -> Any:
    """``obj.get_<name>_display()``: the label of a field's choice (a request's state, a quota request's status),
    with the field's choices made a dict once instead of at every call (Django flattens and hashes them each time:
    most of a list row's time went to its state's label). The labels are kept as text per active language, since a
    lazy label is translated again at each ``str()``."""
    field = obj._meta.get_field(name)
    key = (field, get_language())
    labels = _LABELS.get(key)
    if labels is None:
        labels = _LABELS[key] = {make_hashable(value): force_str(label, strings_only=True)
                                 for value, label in field.flatchoices}
    value = getattr(obj, field.attname)
    found = labels.get(make_hashable(value))
    return force_str(value, strings_only=True) if found is None else found


@register.simple_tag(takes_context=True)
def jinja(context: template.Context, name: str, **values: Any) -> SafeString:
    """The Jinja2 template ``name`` (templates/jinja2/) with ``values``, the request and its CSRF token: a list's rows
    in a Django page (docs/performance.md). An htmx answer of one row renders the same template.

    The rows get the page's CSRF token (Django's, masked once per page): the backend's own ``csrf_input`` is lazy and
    masks the secret anew at every ``{{ csrf_input }}``, once per row of a list (a tenth of the inbox's time)."""
    template = engines["jinja2"].get_template(name)
    request = context.get("request")
    if request is None:
        return mark_safe(template.render(values))
    token = context.get("csrf_token")
    token = str(token) if token is not None else get_token(request)
    values = {**values, "request": request, "csrf_token": token,
              "csrf_input": format_html('<input type="hidden" name="csrfmiddlewaretoken" value="{}">', token)}
    for processor in template.backend.template_context_processors:
        values.update(processor(request))
    return mark_safe(jinja_env.render_released(template.template, values))


@register.simple_tag(takes_context=True)
def jinja_body(context: template.Context, name: str) -> SafeString:
    """``jinja`` with the whole page's context: a page whose body is one Jinja2 template, the Django template only
    extending the page frame (``base.html``) with it (docs/performance.md)."""
    return jinja(context, name, **context.flatten())


class _FrameNode(template.Node):
    """``{% jinja_frame %}``: the page's title, content and scripts rendered by Django (its blocks, which the page's
    template fills), then the page frame around them, Jinja2's ``frame.html``."""

    child_nodelists = ("title", "content", "scripts")  # the blocks inside are found by ``{% extends %}``

    def __init__(self, title: template.NodeList, content: template.NodeList, scripts: template.NodeList) -> None:
        self.title, self.content, self.scripts = title, content, scripts

    def render(self, context: template.Context) -> SafeString:
        parts = {name: mark_safe(getattr(self, name).render(context)) for name in self.child_nodelists}
        return jinja(context, "frame.html", user=context.get("user"), messages=context.get("messages"),
                     ops_capacity_section=context.get("ops_capacity_section"), **parts)


@register.tag
def jinja_frame(parser: Any, token: Any) -> _FrameNode:
    """``{% jinja_frame %}title{% frame_slot %}content{% frame_slot %}scripts{% end_jinja_frame %}`` (``base.html``):
    Django's blocks, written into the Jinja2 frame, which costs a fraction of what the same frame cost in Django's
    engine on every page (docs/performance.md)."""
    parts = []
    for end in ("frame_slot", "frame_slot", "end_jinja_frame"):
        parts.append(parser.parse((end,)))
        parser.delete_first_token()
    return _FrameNode(*parts)


class _Values:
    """What ``render_value_in_context`` reads of a template context: the settings' defaults, autoescape on."""

    use_tz = None
    use_l10n = None
    autoescape = True


def written(value: Any) -> str:
    """``{{ value }}`` as the template engine writes it (local time, localisation, escaping), for the tags that write
    a page's rows in Python. A plain string is only escaped (``html.escape``, what Django's ``escape`` runs, without
    its check for lazy arguments: a tenth of a row's time) and a safe one kept, as the engine ends up doing with them;
    an ``int`` is its digits while the settings group no thousands (what ``localize`` comes to then)."""
    kind = type(value)
    if kind is str:
        return html.escape(value)
    if kind is SafeString:
        return value
    if kind is int and not settings.USE_THOUSAND_SEPARATOR:
        return str(value)
    return render_value_in_context(value, _Values)
