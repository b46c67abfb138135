"""With DEBUG off, errors on pages are the portal's own pages in its layout (brand, menu for a signed-in user,
a plain sentence, a way back); the API keeps its JSON error shape. Nothing of an exception's internals leaks."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from tests.workloads.factories import make_catalogue, make_request

pytestmark = [pytest.mark.django_db]


def _in_layout(response, *, signed_in: bool) -> str:
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert 'class="topbar"' in html and "GPU Portal" in html and '<main id="main"' in html
    assert ('aria-label="Main"' in html) is signed_in  # the menu, for someone signed in
    assert "Traceback" not in html
    return html


@override_settings(DEBUG=False)
def test_404_page_is_in_the_layout(as_user) -> None:
    client = as_user("carol")
    html = _in_layout(client.get("/no/such/page/"), signed_in=True)
    assert "Not found" in html and "not visible to you" in html and 'href="/"' in html
    assert client.get("/no/such/page/").status_code == 404


@override_settings(DEBUG=False)
def test_404_for_another_tenants_request_is_the_same_page(as_user, cast) -> None:
    cat = make_catalogue(cast)
    theirs = make_request(cat, cast.llm, cast.frank)
    response = as_user("carol").get(f"/requests/{theirs.pk}/")
    assert response.status_code == 404
    html = _in_layout(response, signed_in=True)
    assert "Not found" in html and theirs.name not in html


@override_settings(DEBUG=False)
def test_404_signed_out_has_no_menu(client) -> None:
    response = client.get("/no/such/page/")
    assert response.status_code == 404
    _in_layout(response, signed_in=False)


@override_settings(DEBUG=False)
def test_403_page_says_why_in_the_layout(as_user, cast) -> None:
    # carol (a member) may not archive her project: the view refuses with PermissionDenied.
    response = as_user("carol").post("/projects/acme-vision/status/", {"status": "archived"})
    assert response.status_code == 403
    html = _in_layout(response, signed_in=True)
    assert "Not allowed" in html and "Only tenant admins and ops archive or restore a project." in html


@override_settings(DEBUG=False)
def test_csrf_failure_is_a_friendly_page(cast) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.carol)
    response = client.post("/projects/acme-vision/tokens/", {"name": "x"})
    assert response.status_code == 403
    html = _in_layout(response, signed_in=True)
    assert "This form has expired" in html and "reload the page" in html


@pytest.mark.urls("tests.security.urls_errors")
@override_settings(DEBUG=False)
def test_403_400_500_pages_and_the_api_keeps_json(cast) -> None:
    client = Client(raise_request_exception=False)
    client.force_login(cast.carol)

    refused = client.get("/refuse/")
    assert refused.status_code == 403 and "Only the owls may read this." in _in_layout(refused, signed_in=True)
    unreadable = client.get("/unreadable/")
    assert unreadable.status_code == 400
    html = _in_layout(unreadable, signed_in=True)
    assert "Bad request" in html and "forged" not in html
    boom = client.get("/boom/")
    assert boom.status_code == 500
    html = _in_layout(boom, signed_in=False)  # Django renders 500.html without a context: no menu, no user
    assert "Something went wrong" in html and "boom" not in html

    api_refused = client.get("/api/v1/refuse/")
    assert api_refused.status_code == 403 and api_refused["Content-Type"] == "application/json"
    assert api_refused.json() == {"error": "permission_denied", "detail": "Only the owls may read this."}
    api_unreadable = client.get("/api/v1/unreadable/")
    assert api_unreadable.status_code == 400 and api_unreadable.json()["error"] == "invalid"
    assert "forged" not in api_unreadable.content.decode()
    api_missing = client.get("/api/v1/no-such-thing/")
    assert api_missing.status_code == 404 and api_missing.json() == {"error": "not_found", "detail": "Not found."}
    # An API object the caller may not see: DRF's own 404, same shape.
    assert client.get("/api/v1/requests/999999/").json()["error"] == "not_found"


def test_favicon_ico_points_at_the_icon(client) -> None:
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response["Location"].endswith("favicon.svg")


@override_settings(DEBUG=True)
def test_with_debug_on_a_404_is_still_the_portals_page(as_user, cast, settings) -> None:
    """``make run`` (DEBUG on): a URL with no route and a page's own 404 are the portal's 404 page, not Django's debug
    page listing every URL pattern; DEBUG_404 brings the debug page back."""
    cat = make_catalogue(cast)
    theirs = make_request(cat, cast.llm, cast.frank)
    client = as_user("carol")
    for path in ("/no/such/page/", f"/requests/{theirs.pk}/"):
        response = client.get(path)
        assert response.status_code == 404, path
        html = _in_layout(response, signed_in=True)
        assert "Not found" in html and "URLconf" not in html and "admin/" not in html, path
    api = client.get("/api/v1/no-such-thing/")
    assert api.status_code == 404 and api.json() == {"error": "not_found", "detail": "Not found."}
    settings.DEBUG_404 = True
    debug = client.get("/no/such/page/").content.decode()
    assert "Using the URLconf defined in" in debug
