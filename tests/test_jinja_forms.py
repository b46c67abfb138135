"""The forms written by Jinja2 (templates/jinja2/includes/form_fields.html, form_errors.html and field.html: the
only templates of a form; the Django includes of the same names write them, docs/performance.md) are byte for byte
what the Django templates they replaced wrote (kept below as the reference, ``OLD``), through the Django includes and
through ``{% jinja %}``:
every kind of field and widget the portal's forms use, labels and help texts with markup and apostrophes (Django
writes ``'`` as ``&#x27;``, MarkupSafe as ``&#39;``), safe help texts, field errors, the form's own errors and a
hidden field's, unbound and bound; and the portal's forms that pages write this way."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django import forms
from django.template import Context, Engine, engines
from django.utils.safestring import mark_safe
from django.utils.translation import gettext_lazy

from quotas.forms import DecisionForm, ProjectQuotaForm, QuotaRequestForm, TenantQuotaForm
from tenants.forms import ProjectIdleForm, TokenCreateForm

# The Django includes as they were before the forms had one template each: the reference.
OLD = {'form_fields.html': '{% include "includes/form_errors.html" %}\n{% for hidden in form.hidden_fields %}{{ hidden }}{% endfor %}\n{% for field in form.visible_fields %}{% include "includes/field.html" %}{% endfor %}\n', 'form_errors.html': '{# The errors of a form that belong to no visible field: its own and its hidden fields\'. Each error is shown once: field errors only next to their field (includes/field.html), never in this summary too. #}\n{% if form.non_field_errors %}<div class="form-errors" role="alert">{{ form.non_field_errors }}</div>{% endif %}\n{% for hidden in form.hidden_fields %}{% if hidden.errors %}<div class="form-errors" role="alert">{{ hidden.errors }}</div>{% endif %}{% endfor %}\n', 'field.html': '<div class="field{% if field.errors %} field-invalid{% endif %}{% if field.field.widget.input_type == \'checkbox\' %} field-check{% endif %}">\n  <label for="{{ field.id_for_label }}">{{ field.label }}</label>\n  {{ field }}\n  {{ field.errors }}\n  {% if field.help_text %}<p class="help" id="{{ field.auto_id }}_helptext">{{ field.help_text }}</p>{% endif %}\n</div>\n'}
REFERENCE = Engine(loaders=[("django.template.loaders.locmem.Loader", {f"includes/{name}": text for name, text in OLD.items()})])
DJANGO_FORM = REFERENCE.from_string('{% include "includes/form_fields.html" %}')
DJANGO_FIELD = REFERENCE.from_string('{% include "includes/field.html" %}')
JINJA_FORM = engines["django"].from_string('{% load page_kit %}{% jinja "includes/form_fields.html" form=form %}')
JINJA_FIELD = engines["django"].from_string('{% load page_kit %}{% jinja "includes/field.html" field=field %}')
INCLUDED_FORM = engines["django"].from_string('{% include "includes/form_fields.html" %}')  # the pages' Django include
INCLUDED_FIELD = engines["django"].from_string('{% include "includes/field.html" %}')
CHOICES = [("", "Any"), ("a", "A & <b>'s"), ("b", "B")]


class Everything(forms.Form):
    text = forms.CharField(label="Project's <name>", help_text="Say \"why\" & it's <fine>", max_length=20)
    safe_help = forms.CharField(required=False, help_text=mark_safe("See <a href='/docs/'>the docs</a>"))
    lazy = forms.CharField(required=False, label=gettext_lazy("Lazy label"), help_text=gettext_lazy("Lazy help"))
    number = forms.DecimalField(required=False, min_value=Decimal("0"))
    integer = forms.IntegerField(min_value=0, label="How many?")
    email = forms.EmailField(required=False)
    day = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    when = forms.DateTimeField(required=False)
    secret = forms.CharField(required=False, widget=forms.PasswordInput)
    hidden = forms.CharField(widget=forms.HiddenInput, required=False)
    other_hidden = forms.IntegerField(widget=forms.HiddenInput, required=False)
    choice = forms.ChoiceField(choices=CHOICES, required=False)
    many = forms.MultipleChoiceField(choices=CHOICES[1:], required=False)
    ticks = forms.MultipleChoiceField(choices=CHOICES[1:], required=False, widget=forms.CheckboxSelectMultiple)
    radio = forms.ChoiceField(choices=CHOICES[1:], required=False, widget=forms.RadioSelect)
    flag = forms.BooleanField(required=False, label="It's on", help_text="Tick <it>")
    notes = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    upload = forms.FileField(required=False)

    def clean(self):
        data = super().clean()
        if data.get("text") == "clash":
            raise forms.ValidationError("The form's own <error> & more.")
        return data


def both(form: forms.Form) -> tuple[str, str]:
    reference = DJANGO_FORM.render(Context({"form": form}))
    assert INCLUDED_FORM.render({"form": form}) == reference  # a Django page's include writes the same
    return reference, JINJA_FORM.render({"form": form})


@pytest.mark.parametrize("data", [
    None,
    {},
    {"text": "ok", "integer": "3", "flag": "on", "choice": "a", "many": ["a", "b"], "ticks": ["b"], "radio": "a",
     "notes": "<script>it's</script>", "hidden": "x'y", "other_hidden": "1"},
    {"text": "clash", "integer": "-1", "number": "abc", "email": "nope", "day": "x", "when": "y",
     "other_hidden": "z", "choice": "zzz"},
], ids=["unbound", "empty", "valid", "every-error"])
def test_every_field_kind_is_written_as_django_writes_it(data):
    form = Everything(data)
    if data is not None:
        form.is_valid()
    django_html, jinja_html = both(form)
    assert jinja_html == django_html
    if data and data.get("text") == "clash":
        # The case covers what it says: the form's own error, a hidden field's and the fields' own are all written.
        assert "The form&#x27;s own &lt;error&gt;" in django_html and django_html.count('class="form-errors"') == 2
        assert 'class="field field-invalid"' in django_html
    assert "Project&#x27;s &lt;name&gt;" in django_html and "field field-check" in django_html
    assert "<a href='/docs/'>the docs</a>" in django_html


def test_a_prefixed_form_and_a_form_without_ids():
    for form in (Everything(prefix="p"), Everything(auto_id=False), Everything({"text": ""}, auto_id="x_%s")):
        form.is_valid() if form.is_bound else None
        django_html, jinja_html = both(form)
        assert jinja_html == django_html


def test_one_field_is_written_as_django_writes_it():
    form = Everything({"text": "", "flag": "on"})
    form.is_valid()
    for field in form:
        reference = DJANGO_FIELD.render(Context({"field": field}))
        assert JINJA_FIELD.render({"field": field}) == reference, field.name
        assert INCLUDED_FIELD.render({"field": field}) == reference, field.name


@pytest.mark.django_db
def test_the_portal_forms_written_by_jinja2(rf):
    """The forms of the pages that write them with Jinja2: the quota pages' and the project page's, bound and not."""
    forms_ = [
        ProjectQuotaForm(projects=[], flavors=[]), ProjectQuotaForm({"project": "nope", "amount": "-1"}),
        TenantQuotaForm(flavors=[]), TenantQuotaForm({"tenant": "<x>'", "amount": "x"}),
        QuotaRequestForm(flavors=[], initial={"target": "a'b"}),
        QuotaRequestForm({"amount": "1", "reason": "", "until": "soon", "share_cores_percent": "101"}),
        TokenCreateForm(), TokenCreateForm(can_submit=False),
        TokenCreateForm({"token-name": "", "token-expires_days": "100000", "token-scope": "nope"}),
        ProjectIdleForm(), ProjectIdleForm({"idle-cull_idle_notebooks_by_gpu": "on"}),
        DecisionForm(prefix="bulk"),
    ]
    for form in forms_:
        if form.is_bound:
            form.is_valid()
        django_html, jinja_html = both(form)
        assert jinja_html == django_html, type(form).__name__
