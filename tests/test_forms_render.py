"""``portal.forms_render.FastTemplates`` writes exactly what Django's widget templates write, for every widget it
takes over and for the portal's own forms; anything else goes to the templates."""

from __future__ import annotations

import datetime
from decimal import Decimal

import pytest
from django import forms
from django.forms.renderers import DjangoTemplates
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy

from portal.forms_render import FastTemplates

SLOW, FAST = DjangoTemplates(), FastTemplates()
CHOICES = [("", "Any"), ("a", "A & <b>"), (1, 2), ("Group", [("g1", "One"), ("g2", gettext_lazy("Two"))]), ("d", Decimal("1.50"))]


class Everything(forms.Form):
    text = forms.CharField(help_text="Say <why>", max_length=20)
    number = forms.DecimalField(required=False)
    integer = forms.IntegerField(min_value=0)
    email = forms.EmailField(required=False, widget=forms.EmailInput(attrs={"autocomplete": "off", "data-x": True,
                                                                             "data-y": False}))
    day = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    when = forms.DateTimeField(required=False)
    secret = forms.CharField(widget=forms.PasswordInput(render_value=True))
    hidden = forms.CharField(widget=forms.HiddenInput, required=False)
    flag = forms.BooleanField(required=False)
    notes = forms.CharField(widget=forms.Textarea(attrs={"rows": 2}), required=False)
    choice = forms.ChoiceField(choices=CHOICES, required=False)
    many = forms.MultipleChoiceField(choices=CHOICES, required=False)
    maybe = forms.NullBooleanField(required=False)
    upload = forms.FileField(required=False)


DATA = [
    {},
    {"text": 'a "quoted" <tag> & more', "number": "1.50", "integer": "-3", "email": "x@y", "day": "2026-12-01",
     "when": "2026-12-01 10:00", "secret": "s<e>cret", "hidden": "h&", "flag": "on", "notes": "line 1\nline <2>",
     "choice": "g2", "many": ["a", "1", "d"], "maybe": "true"},
    {"choice": "nope", "integer": "x", "notes": ""},
]


@pytest.mark.parametrize("data", DATA)
def test_every_widget_as_the_templates_write_it(data):
    for bound in (False, True):
        slow = Everything(data if bound else None, renderer=SLOW, prefix="p",
                          initial={"text": mark_safe("<i>safe</i>"), "day": datetime.date(2026, 1, 2),
                                   "when": datetime.datetime(2026, 1, 2, 3, 4, tzinfo=datetime.UTC), "number": Decimal("2.5"),
                                   "choice": 1, "many": ["g1"], "flag": True})
        fast = Everything(data if bound else None, renderer=FAST, prefix="p", initial=slow.initial)
        for name in slow.fields:
            assert str(fast[name]) == str(slow[name]), name
            assert str(fast[name].errors) == str(slow[name].errors), name  # empty, or the errors' list
        assert str(fast.errors) == str(slow.errors) and str(fast.non_field_errors()) == str(slow.non_field_errors())
        assert str(fast) == str(slow)
    if data.get("integer") == "x":
        assert '<ul class="errorlist"' in str(fast["integer"].errors)


def test_the_portals_forms_as_the_templates_write_them():
    from quotas.forms import TenantQuotaForm
    from workloads.forms import BulkDecisionForm, DecisionForm

    for form_class, kwargs in ((DecisionForm, {"prefix": "decide-7"}), (BulkDecisionForm, {"prefix": "bulk"}),
                               (TenantQuotaForm, {})):
        for data in (None, {}):
            slow, fast = form_class(data, renderer=SLOW, **kwargs), form_class(data, renderer=FAST, **kwargs)
            for name in slow.fields:
                assert str(fast[name]) == str(slow[name]), (form_class, name)


def test_other_templates_are_the_templates():
    radio = forms.RadioSelect(choices=CHOICES)
    assert radio.render("r", "a", renderer=FAST) == radio.render("r", "a", renderer=SLOW)
    dates = forms.SelectDateWidget()
    assert dates.render("d", datetime.date(2026, 2, 3), renderer=FAST) == dates.render("d", datetime.date(2026, 2, 3),
                                                                                       renderer=SLOW)


def test_it_is_the_portals_renderer(settings):
    from django.forms.renderers import get_default_renderer

    assert isinstance(get_default_renderer(), FastTemplates)
    assert FAST._fast  # Django's own templates: the fast way is taken
    assert FAST._own_error_lists
