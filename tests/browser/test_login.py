"""Signing in and out in a real browser."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_wrong_password_shows_an_error_then_right_one_lands_on_home(new_page, cast, password) -> None:
    page = new_page()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/\?next=/$"))  # anonymous users sign in first

    page.get_by_label("Username").fill("carol")
    page.get_by_label("Password").fill("not-her-password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("do not match")

    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="My projects")).to_be_visible()
    cards = page.get_by_role("list", name="Projects").get_by_role("listitem")
    expect(cards).to_have_count(1)
    expect(cards.first).to_contain_text("Vision")
    expect(cards.first).to_contain_text("Member")


def test_sign_out_from_the_user_menu(signed_in) -> None:
    page = signed_in("carol")
    page.get_by_text("carol", exact=True).click()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/accounts/login/"))


def test_repeated_failures_are_throttled(new_page, cast, password, settings) -> None:
    settings.LOGIN_THROTTLE_ATTEMPTS = 3
    page = new_page()
    page.goto("/accounts/login/")
    for _ in range(3):
        page.get_by_label("Username").fill("dave")
        page.get_by_label("Password").fill("guess")
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_load_state()
    page.get_by_label("Username").fill("dave")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_contain_text("Too many failed sign-in attempts")
