"""Post/redirect/get in a real browser: reloading after creating a token creates no second one, and
Back then send again on a request form leads to the request the first send made."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tenants.models import ApiToken
from tests.workloads.factories import make_catalogue
from workloads.models import WorkloadRequest

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_reloading_after_creating_a_token_creates_no_second_one(signed_in, cast) -> None:
    carol = signed_in("carol")
    carol.goto("/projects/acme-vision/")
    carol.get_by_text("New token").click()
    carol.get_by_label("Name").fill("ci-nightly")
    carol.get_by_role("button", name="Create token").click()
    secret = carol.get_by_label("Token secret")
    expect(secret).to_have_value(re.compile(r"^gpp_"))
    assert re.search(r"/projects/acme-vision/#tokens$", carol.url)  # the redirect's page, not the POST's answer
    # (and no ?form=<token> in the address: it ended up in bookmarks; the token is kept in the history entry)

    carol.reload()
    expect(carol.get_by_label("Token secret")).to_have_count(0)  # shown once
    assert "form=" not in carol.url
    expect(carol.locator("tr", has_text="ci-nightly")).to_have_count(1)
    assert ApiToken.objects.filter(name="ci-nightly").count() == 1


def test_back_and_send_again_makes_one_request(signed_in, cast) -> None:
    make_catalogue(cast)
    carol = signed_in("carol")
    carol.goto("/requests/new/?template=training")
    carol.wait_for_load_state()
    assert carol.url.endswith("/requests/new/?template=training")  # no ?form=<token> added to the address
    carol.get_by_label("Command").fill("python train.py")  # no name: one is made up
    carol.get_by_role("button", name="Submit request").click()
    expect(carol.get_by_role("status").first).to_contain_text("submitted")
    first_url = carol.url
    req = WorkloadRequest.objects.get()

    carol.go_back()  # the form again, as it was sent
    expect(carol.get_by_role("heading", name="New training job")).to_be_visible()
    carol.get_by_role("button", name="Submit request").click()
    expect(carol.get_by_role("status").first).to_contain_text(f"This form was already sent: here is request {req.name}.")
    assert carol.url == first_url and "form=" not in first_url
    assert WorkloadRequest.objects.count() == 1


def test_an_old_address_with_a_form_token_loses_it(signed_in, cast) -> None:
    carol = signed_in("carol")
    carol.goto("/projects/acme-vision/?form=0123456789abcdef0123456789abcdef")
    carol.wait_for_load_state()
    expect(carol.get_by_role("heading", name="Vision")).to_be_visible()
    carol.wait_for_function("!window.location.search.includes('form=')")
    assert carol.url.endswith("/projects/acme-vision/")
