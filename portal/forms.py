"""The shared kit for portal forms: number fields that say when a number is too large, and one-time
form tokens so a replayed form (reload, Back and send again, a double click) changes nothing.

Numbers
-------
Browsers turn what an ``<input type="number">`` cannot hold (``1e309``, ``12abc``) into an empty
value before sending, so the server could only answer "This field is required". These fields render
as text inputs with an ``inputmode`` (the phone keyboard is the same) and say what is wrong:
"This number is too large (at most 9999.99)." ``number_problem()`` is the same rule for the API.

One-time form tokens
--------------------
``OneTimeFormMixin`` adds a hidden token, new each time the form is rendered. ``once_claim()``
consumes it when the form is posted (an atomic ``cache.add``, per user); the view then either does
the work and records where its result is (``Once.done(url)``), or gives the token back when the form
had errors (``Once.release()``), so the corrected form can be sent. A second POST with the same token
is answered by ``once_replay()``: the same values redirect to the first result (nothing is created
again); other values (Back, edit, send) are shown again with a fresh token and a note, never lost.
Every POST form redirects after success (post/redirect/get), so a reload repeats a GET.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.cache import cache
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from portal.inputs import JsonRefused, json_loads

# The largest whole number a plain form number may hold (PostgreSQL ``integer``).
MAX_INTEGER = 2**31 - 1


def _plain(value: Decimal) -> str:
    return format(value.normalize(), "f")


def too_large_message(value: Decimal | float | int, limit: Decimal | int | None = None) -> str:
    """"This number is too large (at most 9999.99)." or, below zero, "This number is too small."."""
    if value < 0:
        return "This number is too small."
    if limit is None:
        return "This number is too large."
    return f"This number is too large (at most {_plain(Decimal(limit))})."


def decimal_limit(max_digits: int | None, decimal_places: int | None) -> Decimal | None:
    """The largest magnitude a decimal with ``max_digits`` / ``decimal_places`` holds (9999.99 for 6/2)."""
    if max_digits is None:
        return None
    places = decimal_places or 0
    return Decimal(10) ** (max_digits - places) - Decimal(1).scaleb(-places)


def _as_decimal(value: Any) -> Decimal | None:
    """``value`` (a number, or text) as a Decimal; None when it is no number at all (or NaN)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        if math.isnan(value):
            return None
        return Decimal(value) if math.isfinite(value) else Decimal("Infinity") if value > 0 else Decimal("-Infinity")
    if isinstance(value, (int, Decimal)):
        number = Decimal(value)
    elif isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except (InvalidOperation, ValueError):
            return None
    else:
        return None
    return None if number.is_nan() else number


FLOAT_MAX = Decimal(1.7976931348623157e308)


def number_problem(value: Any, *, kind: str, max_digits: int | None = None, decimal_places: int | None = None,
                   max_value: Any = None) -> str | None:
    """Why ``value`` (a number, or text) is too large (or too far below zero) to be taken, or None.

    ``kind``: ``integer`` (at most PostgreSQL's integer), ``decimal`` (the whole digits
    ``max_digits``/``decimal_places`` leave) or ``float`` (finite as a float). The message names the
    largest number taken: ``max_value`` when the field has one. Whether the text is a number at all,
    and the field's own minimum and maximum, stay with the field.
    """
    number = _as_decimal(value)
    if number is None:
        return None
    if kind == "decimal":
        limit = decimal_limit(max_digits, decimal_places)
    elif kind == "integer":
        limit = Decimal(MAX_INTEGER)
    else:
        limit = FLOAT_MAX
    if not number.is_infinite() and (limit is None or abs(number) <= limit):
        return None
    shown = limit if kind != "float" else None
    if max_value is not None:
        shown = Decimal(str(max_value)) if shown is None else min(shown, Decimal(str(max_value)))
    return too_large_message(number, shown)


class NumberTextInput(forms.TextInput):
    """A text input for numbers: the browser sends what was typed, so the server can say what is wrong."""

    def __init__(self, attrs: dict[str, Any] | None = None, *, inputmode: str = "decimal") -> None:
        base = {"inputmode": inputmode, "autocomplete": "off", "spellcheck": "false"}
        super().__init__({**base, **(attrs or {})})


class IntegerField(forms.IntegerField):
    """A whole number; text beyond ``max_value`` (or PostgreSQL's integer) says it is too large."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", NumberTextInput(inputmode="numeric"))
        super().__init__(**kwargs)

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        attrs = super().widget_attrs(widget)
        for name in ("min", "max", "step"):
            attrs.pop(name, None)  # meaningless on a text input
        return attrs

    def to_python(self, value: Any) -> int | None:
        problem = number_problem(value, kind="integer", max_value=self.max_value)
        try:
            number = super().to_python(value)
        except ValidationError:
            if problem:  # "1e309": no whole number Python reads, but clearly too large
                raise ValidationError(problem, code="too_large") from None
            raise
        if problem and self.max_value is None:
            raise ValidationError(problem, code="too_large")
        return number


class DecimalField(forms.DecimalField):
    """A decimal; more whole digits than it holds (``1e309``) says "too large (at most ...)"."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", NumberTextInput(inputmode="decimal"))
        super().__init__(**kwargs)

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        attrs = super().widget_attrs(widget)
        for name in ("min", "max", "step"):
            attrs.pop(name, None)
        return attrs

    def validate(self, value: Any) -> None:
        super().validate(value)
        if value in self.empty_values or not value.is_finite():
            return
        problem = number_problem(value, kind="decimal", max_digits=self.max_digits, decimal_places=self.decimal_places,
                                 max_value=self.max_value)
        if problem:
            raise ValidationError(problem, code="too_large")


class FloatField(forms.FloatField):
    """A floating-point number; ``1e309`` (infinite as a float) says "too large", not "not a number"."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("widget", NumberTextInput(inputmode="decimal"))
        super().__init__(**kwargs)

    def widget_attrs(self, widget: forms.Widget) -> dict[str, Any]:
        attrs = super().widget_attrs(widget)
        for name in ("min", "max", "step"):
            attrs.pop(name, None)
        return attrs

    def to_python(self, value: Any) -> float | None:
        if isinstance(value, str) and value.strip():
            try:
                number = Decimal(value.strip())
            except (InvalidOperation, ValueError):
                number = None
            if number is not None and number_problem(number, kind="float"):
                raise ValidationError(number_problem(number, kind="float", max_value=self.max_value), code="too_large")
        return super().to_python(value)


# One-time form tokens ----------------------------------------------------------------------------

ONCE_FIELD = "form_token"
_TOKEN = re.compile(r"[A-Za-z0-9_.:-]{8,200}")
_NOT_DATA = {"csrfmiddlewaretoken"}


class JSONField(forms.JSONField):
    """Django's JSON field, refusing what ``portal.inputs.json_loads`` refuses (a NUL or a lone surrogate,
    nesting too deep) with a field error, and showing such text back as it was typed."""

    def to_python(self, value: Any) -> Any:
        if self.disabled or value in self.empty_values or not isinstance(value, str):
            return super().to_python(value)
        try:
            json_loads(value)
        except JsonRefused as refused:
            raise ValidationError(refused.detail, code="invalid") from None
        except ValueError:
            pass  # not JSON: Django's own message
        return super().to_python(value)

    def bound_data(self, data: Any, initial: Any) -> Any:
        if isinstance(data, str) and not self.disabled:
            try:
                json_loads(data)
            except JsonRefused:
                return forms.fields.InvalidJSONInput(data)
            except ValueError:
                pass
        return super().bound_data(data, initial)


def new_form_token() -> str:
    return secrets.token_hex(16)


ONCE_PARAM = "form"


class OneTimeFormMixin:
    """Adds the hidden one-time token (``once_field``, ``form_token`` unless the form names another).

    Put it first among the bases: ``class TokenCreateForm(OneTimeFormMixin, forms.Form)``. The page
    keeps the token in its history entry's state (``static/js/portal.js``, from the hidden input's ``data-once``;
    never in the address, which ends up in bookmarks), so Back to a form already sent, which browsers often load
    afresh, puts the same token back and sending it again is a replay. A ``?form=<token>`` in an address (older
    links) is still read once (``once_initial()``) and taken out of the address by the script."""

    once_field = ONCE_FIELD

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        fields = self.fields  # type: ignore[attr-defined]
        if self.once_field not in fields:
            fields[self.once_field] = forms.CharField(widget=forms.HiddenInput, required=False, max_length=200)
        fields[self.once_field].widget.attrs["data-once"] = ONCE_PARAM
        if not self.is_bound and not _TOKEN.fullmatch(str(self.initial.get(self.once_field) or "")):  # type: ignore[attr-defined]
            self.initial[self.once_field] = new_form_token()  # type: ignore[attr-defined]

    def once_token(self) -> str:
        """The token this POST carries, or "" (none, or not one the portal makes)."""
        raw = str(self.data.get(self.add_prefix(self.once_field), "") or "").strip()  # type: ignore[attr-defined]
        return raw if _TOKEN.fullmatch(raw) else ""

    def once_renew(self) -> None:
        """A fresh token in the re-rendered form, so sending it again is a new submission."""
        self.data = self.data.copy()  # type: ignore[attr-defined]
        self.data[self.add_prefix(self.once_field)] = new_form_token()  # type: ignore[attr-defined]

    def once_fingerprint(self) -> str:
        """sha256 of the posted values, without the CSRF and one-time tokens."""
        skip = _NOT_DATA | {self.add_prefix(self.once_field)}  # type: ignore[attr-defined]
        data = self.data  # type: ignore[attr-defined]
        items = sorted((key, list(data.getlist(key)) if hasattr(data, "getlist") else [str(data[key])])
                       for key in data if key not in skip)
        return hashlib.sha256(repr(items).encode()).hexdigest()


def once_initial(request: HttpRequest, form_class: type[OneTimeFormMixin]) -> dict[str, str]:
    """``initial`` for a form rendered by a GET: the token in the address (``?form=``), when it is one."""
    token = str(request.GET.get(ONCE_PARAM, "") or "").strip()
    return {form_class.once_field: token} if _TOKEN.fullmatch(token) else {}


def once_sent(request: HttpRequest, form: OneTimeFormMixin) -> dict[str, Any] | None:
    """What became of the unbound ``form``'s token, when it was sent already: ``{"url", "message"}``."""
    user = getattr(request, "user", None)
    token = str(form.initial.get(form.once_field) or "")  # type: ignore[attr-defined]
    if not token or user is None or not user.is_authenticated:
        return None
    seen = cache.get(f"form-once:{user.pk}:{token}") or {}
    return seen if seen.get("state") == "done" and seen.get("url") else None


@dataclass
class Once:
    """One claim on a form token. ``first``: this POST is the first with it (do the work)."""

    key: str | None
    first: bool
    fingerprint: str = ""
    seen: dict[str, Any] = field(default_factory=dict)

    def done(self, url: str, message: str = "") -> None:
        """The work is done: replays of this form redirect to ``url`` (with ``message``)."""
        if self.key:
            cache.set(self.key, {"state": "done", "fp": self.fingerprint, "url": url, "message": message},
                      settings.PORTAL_FORM_TOKEN_SECONDS)

    def release(self) -> None:
        """Nothing was done (the form had errors): the token may be sent again."""
        if self.key:
            cache.delete(self.key)
            self.key = None


def once_claim(request: HttpRequest, form: OneTimeFormMixin, *, wait: float = 5.0) -> Once:
    """Claim the posted form's token for ``request.user``. A POST without a token (not from a page
    the portal rendered) is always "first": it is handled like any POST."""
    token = form.once_token()
    user = getattr(request, "user", None)
    if not token or user is None or not user.is_authenticated:
        return Once(None, True)
    key = f"form-once:{user.pk}:{token}"
    fingerprint = form.once_fingerprint()
    if cache.add(key, {"state": "pending", "fp": fingerprint}, settings.PORTAL_FORM_TOKEN_SECONDS):
        return Once(key, True, fingerprint)
    seen = cache.get(key) or {}
    deadline = time.monotonic() + wait
    while seen.get("state") == "pending" and time.monotonic() < deadline:
        time.sleep(0.1)  # the first POST with this token is still at work (a double click)
        seen = cache.get(key) or {}
    if not seen:  # the first one gave the token back meanwhile: this one may go ahead
        if cache.add(key, {"state": "pending", "fp": fingerprint}, settings.PORTAL_FORM_TOKEN_SECONDS):
            return Once(key, True, fingerprint)
        seen = cache.get(key) or {}
    return Once(key, False, fingerprint, seen)


def once_replay(request: HttpRequest, form: Any, once: Once) -> HttpResponse | None:
    """The answer to a form sent again: a redirect to the first result when the values are the same;
    else None, with the form given a fresh token and a note (the caller shows it again)."""
    seen = once.seen
    if seen.get("state") == "done" and seen.get("fp") == once.fingerprint and seen.get("url"):
        messages.info(request, seen.get("message") or "This form was already sent: nothing was done twice.")
        return redirect(seen["url"])
    form.once_renew()
    if seen.get("state") == "pending":
        form.add_error(None, "This form is being sent already. Wait a moment, then reload the page to see the result.")
    else:
        form.add_error(None, "This form was already sent with other values. Send it again to submit these values too.")
    return None
