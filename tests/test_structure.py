"""Structure rules that are easy to break by accident (docs/conventions.md):

* views read through selectors: no view module (pages, ops pages, API views) queries a model's manager
  itself, so the pages and the API cannot disagree about who sees what;
* nothing outside ``workloads/kinds/`` names a template kind: it asks the kind's traits through the registry;
* templates ask predicates by name (``{% may "app.may_x" ... %}``): every name they use is one an app
  installed, so a typo fails here rather than on the page.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from django.template import Context, Template, TemplateSyntaxError
from django.test import RequestFactory

from tenants.policy import PREDICATES

ROOT = Path(__file__).resolve().parent.parent
APPS = ["portal", "tenants", "quotas", "workloads", "billing", "maintenance", "insights"]
VIEW_MODULES = ("views.py", "ops_views.py", "namespace_views.py", "cost_views.py", "api/views.py", "api/namespaces.py",
                "api/budget_views.py", "review_views.py")

# Reads in a view module: a manager (``Model.objects.``), a model class handed to get_object_or_404, or the
# user model's manager.
READS = [
    re.compile(r"\.objects\."),
    re.compile(r"get_object_or_404\(\s*[A-Z]\w*\s*[,)]"),
    re.compile(r"get_object_or_404\(\s*get_user_model\(\)"),
]
# What may stay, and why. ``Model.objects.none()`` reads nothing: a viewset's class attribute names its model for
# the OpenAPI schema and the router, and ``get_queryset`` returns it while drf-spectacular builds the schema.
ALLOWED = [(re.compile(r"\b[A-Z]\w*\.objects\.none\(\)"), "an empty queryset: reads nothing")]


def view_modules() -> list[Path]:
    found = []
    for app in APPS:
        for name in VIEW_MODULES:
            path = ROOT / app / name
            if path.exists():
                found.append(path)
    return found


def direct_reads(source: str) -> list[tuple[int, str]]:
    hits = []
    for number, line in enumerate(source.splitlines(), start=1):
        code = line.split("#", 1)[0]
        for pattern, _why in ALLOWED:
            code = pattern.sub("", code)
        if any(pattern.search(code) for pattern in READS):
            hits.append((number, line.strip()))
    return hits


def test_the_finder_sees_reads_and_lets_empty_querysets_pass() -> None:
    source = ("rows = Quota.objects.filter(tenant=t)\n"
              "queryset = Flavor.objects.none()  # for the schema\n"
              "x = get_object_or_404(Tenant, slug=slug)\n"
              "u = get_object_or_404(get_user_model(), pk=pk)\n"
              "ok = get_object_or_404(selectors.flavors_for(actor=actor), pk=pk)\n")
    assert [n for n, _ in direct_reads(source)] == [1, 3, 4]


def test_the_view_modules_are_all_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in view_modules()}
    assert {"quotas/views.py", "quotas/namespace_views.py", "quotas/api/views.py", "tenants/views.py",
            "tenants/api/views.py", "workloads/views.py", "workloads/ops_views.py", "workloads/api/views.py"} <= names


def test_views_read_through_selectors() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}: {line}"
             for path in view_modules() for number, line in direct_reads(path.read_text())]
    assert found == [], "Read through a selector instead:\n" + "\n".join(found)


MAY = re.compile(r"""\{%\s*may\s+["']([^"']+)["']""")


def test_templates_ask_only_installed_predicates() -> None:
    asked: dict[str, list[str]] = {}
    for path in sorted((ROOT / "templates").rglob("*.html")):
        for name in MAY.findall(path.read_text()):
            asked.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert asked, "no template asks {% may %}: the pattern is out of date"
    unknown = {name: where for name, where in asked.items() if name not in PREDICATES}
    assert not unknown, f"templates ask predicates no app installed: {unknown}"


FLAG = re.compile(r"""["'](writable|nav_admins_tenants|is_ops|can_\w+|may_\w+)["']\s*:""")


def test_views_hand_templates_no_permission_flags() -> None:
    """Who may do what is the predicates'; pages ask them (``{% may %}``) instead of flags a view computed."""
    modules = [path for path in view_modules() if path.parent.name != "api"] + [ROOT / "tenants" / "ui.py"]  # pages
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in modules
             for number, line in enumerate(path.read_text().splitlines(), start=1) if FLAG.search(line)]
    assert found == [], "Ask {% may %} in the template instead:\n" + "\n".join(found)


# Kinds are asked, never named ----------------------------------------------------------------------------------------

# Where a template kind's name may be written, and why. Everywhere else asks the registry (``workloads.kinds``) for a
# trait (``gang``, ``serving``, ``proxied``, ``scalable``, ``billed_pods``, ``storage_gib``, ...).
KIND_NAMES_ALLOWED = {
    "workloads/kinds/": "the kinds themselves: each module declares its own name and default template slug",
    "workloads/demo.py": "demo data: it submits one request of each built-in template by slug",
    "insights/demo.py": "demo history: a made-up mix of notebooks, training and inference runs",
}
KIND_ON_A_PAGE = re.compile(r"""[=!]=\s*["'](%s)["']|["'](%s)["']\s*[=!]=""")


def kind_literals(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each place ``source`` names a kind: a string equal to a kind's name, or ``TemplateKind.X``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append((node.lineno, repr(node.value)))
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "TemplateKind"
              and node.attr.lower() in names):
            found.append((node.lineno, f"TemplateKind.{node.attr}"))
    return sorted(found)


def test_the_kind_finder_sees_literals_and_choices() -> None:
    source = ('if req.template.kind == "training":\n    pass\n'
              'qs.filter(template__kind="notebook")\n'
              'ok = kind is TemplateKind.INFERENCE\n'
              'text = "a training job"  # words, not a kind\n'
              'ask = kinds.get(req.template.kind).gang\n')
    assert kind_literals(source, {"training", "notebook", "inference"}) == [
        (1, "'training'"), (3, "'notebook'"), (4, "TemplateKind.INFERENCE")]


def test_only_the_kinds_modules_name_a_kind() -> None:
    """A new kind is one module (docs/extending.md, "Template kinds"): nothing outside ``workloads/kinds/`` (and
    the allow-list, each with its reason) compares, filters or branches on a kind's name; pages neither."""
    from workloads import kinds

    names = set(kinds.names())
    assert {"notebook", "training", "inference", "batchinfer"} <= names
    found = []
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            relative = str(path.relative_to(ROOT))
            if "migrations" in path.parts or any(relative.startswith(a) for a in KIND_NAMES_ALLOWED):
                continue
            found += [f"{relative}:{line}: {what}" for line, what in kind_literals(path.read_text(), names)]
    alternatives = "|".join(sorted(names))
    on_a_page = re.compile(KIND_ON_A_PAGE.pattern % (alternatives, alternatives))
    for path in sorted((ROOT / "templates").rglob("*.html")):
        found += [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
                  for number, line in enumerate(path.read_text().splitlines(), start=1) if on_a_page.search(line)]
    assert found == [], "Ask the kind (workloads.kinds) for a trait instead of naming it:\n" + "\n".join(found)


# The tag ---------------------------------------------------------------------------------------------------------


def render(text: str, user, **context) -> str:
    request = RequestFactory().get("/")
    request.user = user
    return Template("{% load policy %}" + text).render(Context({"request": request, **context}))


def test_may_answers_with_the_predicate_for_the_requests_user(cast) -> None:
    text = '{% may "tenants.may_change_tenant" tenant as ok %}{% if ok %}yes{% else %}no{% endif %}'
    assert [render(text, getattr(cast, who), tenant=cast.acme) for who in ("ops", "alice", "bob", "nobody")] == \
        ["yes", "yes", "no", "no"]
    tier = '{% may "quotas.may_decide" r tier="ops" as ok %}{{ ok }}'
    from quotas.models import QuotaRequest

    request = QuotaRequest(project=cast.vision, requested_by=cast.carol)
    assert render(tier, cast.alice, r=request) == "False" and render(tier, cast.ops, r=request) == "True"


def test_may_asks_once_per_request_for_the_same_question(cast, django_assert_num_queries) -> None:
    request = RequestFactory().get("/")
    request.user = cast.bob
    rows = Template("{% load policy %}{% for p in projects %}"
                    '{% may "tenants.may_approve" p as ok %}{{ p.slug }}={{ ok }};{% endfor %}')
    once = Template('{% load policy %}{% may "tenants.may_approve" vision as ok %}{{ ok }}')
    with django_assert_num_queries(1):  # the actor's scope: bob's memberships, read once for the request
        assert once.render(Context({"request": request, "vision": cast.vision})) == "True"
    with django_assert_num_queries(0):  # answered from the scope (and the first answer is remembered)
        text = rows.render(Context({"request": request, "projects": [cast.vision, cast.nlp, cast.vision]}))
    assert text == "acme-vision=True;acme-nlp=False;acme-vision=True;"


def test_may_refuses_an_unknown_predicate(cast) -> None:
    with pytest.raises(TemplateSyntaxError, match="tenants.may_fly"):
        render('{% may "tenants.may_fly" as ok %}', cast.ops)
