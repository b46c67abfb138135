"""Sign-in throttling under parallel guessing: the portal login and the Django admin login.

40 wrong passwords sent at once from threads to the live server (a real threaded HTTP server on the
test database) must lead to at most LOGIN_THROTTLE_ATTEMPTS password checks, and the right password
afterwards must be refused while the lock lasts. Password checks are counted by the password hasher
itself (``CountingHasher``), which also takes a little time per check like a real hasher does, so
that parallel requests really overlap.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.contrib.auth.hashers import MD5PasswordHasher

from tenants.models import LoginThrottle
from tenants.throttle import (
    ACCOUNT,
    ADDRESS,
    BUSY,
    FAILED,
    IN_FLIGHT_TTL,
    Blocked,
    login_failed,
    login_reserve,
    login_succeeded,
)
from tests.factories import PASSWORD, UserFactory

pytestmark = pytest.mark.django_db(transaction=True)

PARALLEL = 40
LIMIT = 5


class CountingHasher(MD5PasswordHasher):
    """MD5 (the tests' fast hasher) that counts every password check and takes 50 ms for each."""

    checks = 0
    lock = threading.Lock()

    def verify(self, password: str, encoded: str) -> bool:
        with CountingHasher.lock:
            CountingHasher.checks += 1
        time.sleep(0.05)
        return super().verify(password, encoded)


@pytest.fixture
def counting_hasher(settings):
    settings.PASSWORD_HASHERS = [f"{__name__}.CountingHasher"]
    settings.LOGIN_THROTTLE_ATTEMPTS = LIMIT
    settings.LOGIN_THROTTLE_WINDOW = 300
    CountingHasher.checks = 0
    return CountingHasher


def _session(base: str, path: str) -> tuple[requests.Session, str]:
    """A browser-like session holding the CSRF cookie, and the form's CSRF token."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=PARALLEL))
    page = session.get(base + path, timeout=10)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    return session, token


def _post(base: str, path: str, session: requests.Session, token: str, username: str, password: str) -> requests.Response:
    return session.post(
        base + path,
        data={"csrfmiddlewaretoken": token, "username": username, "password": password},
        headers={"Referer": base + path},
        allow_redirects=False,
        timeout=30,
    )


def _guess_in_parallel(base: str, path: str, username: str) -> list[requests.Response]:
    session, token = _session(base, path)
    with ThreadPoolExecutor(max_workers=PARALLEL) as pool:
        futures = [pool.submit(_post, base, path, session, token, username, f"guess-{n}") for n in range(PARALLEL)]
        return [future.result() for future in futures]


@pytest.mark.parametrize("path", ["/accounts/login/", "/admin/login/"])
def test_parallel_wrong_passwords_get_at_most_the_limit_of_checks(live_server, cast, counting_hasher, path) -> None:
    responses = _guess_in_parallel(live_server.url, path, "ops")
    assert all(response.status_code == 200 for response in responses), [r.status_code for r in responses]
    assert counting_hasher.checks <= LIMIT, f"{counting_hasher.checks} password checks for {PARALLEL} parallel guesses"

    # The right password is refused now, with a message that says for how long.
    checks = counting_hasher.checks
    session, token = _session(live_server.url, path)
    response = _post(live_server.url, path, session, token, "ops", PASSWORD)
    assert response.status_code == 200
    assert "sessionid" not in session.cookies
    assert "Too many failed sign-in attempts" in response.text
    assert re.search(r"paused for \d+ minutes?", response.text)
    assert counting_hasher.checks == checks  # refused before the password was looked at


def test_admin_login_is_throttled_like_the_portal_login(client, cast, settings) -> None:
    settings.LOGIN_THROTTLE_ATTEMPTS = 3
    for _ in range(3):
        response = client.post("/admin/login/", {"username": "ops", "password": "wrong"})
        assert response.status_code == 200
    response = client.post("/admin/login/", {"username": "ops", "password": PASSWORD})
    assert response.status_code == 200
    assert "Too many failed sign-in attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session
    # The portal login shares the count: ops is locked there too.
    response = client.post("/accounts/login/", {"username": "ops", "password": PASSWORD})
    assert "Too many failed sign-in attempts" in response.content.decode()
    assert "_auth_user_id" not in client.session


# -- Right passwords at once from one address (a class behind one NAT, a load test) -------------------------

CLASS = 8


class BarrierHasher(MD5PasswordHasher):
    """MD5 whose checks wait for each other: no check ends before ``CLASS`` of them are running at once,
    so the sign-ins below are provably all in flight together (a refused one would break the barrier)."""

    barrier = threading.Barrier(CLASS, timeout=20)

    def verify(self, password: str, encoded: str) -> bool:
        BarrierHasher.barrier.wait()
        return super().verify(password, encoded)


def _sign_in(base: str, username: str, password: str = PASSWORD) -> tuple[requests.Response, requests.Session]:
    session, token = _session(base, "/accounts/login/")
    return _post(base, "/accounts/login/", session, token, username, password), session


def test_concurrent_right_passwords_from_one_address_all_sign_in(live_server, cast, settings) -> None:
    settings.PASSWORD_HASHERS = [f"{__name__}.BarrierHasher"]
    settings.LOGIN_THROTTLE_ATTEMPTS = LIMIT  # fewer than the sign-ins at once
    BarrierHasher.barrier.reset()
    names = [f"student{n}" for n in range(CLASS)]
    for name in names:
        UserFactory(username=name)
    with ThreadPoolExecutor(max_workers=CLASS) as pool:
        results = list(pool.map(lambda name: _sign_in(live_server.url, name), names))
    assert [response.status_code for response, _ in results] == [302] * CLASS, [r.text[-300:] for r, _ in results]
    assert all("sessionid" in session.cookies for _, session in results)
    # Nothing is left counted against the address: the next sign-ins from it go straight through.
    row = LoginThrottle.objects.get(key="ip:127.0.0.1")
    assert (row.attempts, row.in_flight, row.blocked_until) == (0, 0, 0)


def test_one_user_signing_in_many_times_at_once_is_never_locked_out(live_server, cast, counting_hasher) -> None:
    with ThreadPoolExecutor(max_workers=CLASS) as pool:
        results = list(pool.map(lambda _: _sign_in(live_server.url, "carol"), range(CLASS)))
    codes = [response.status_code for response, _ in results]
    assert 302 in codes
    for response, _ in results:
        assert "Too many failed sign-in attempts" not in response.text
        if response.status_code == 200:  # more checks at once than one username may have: wait a few seconds
            assert "Too many sign-ins at once from your network; try again in a few seconds." in response.text
    assert counting_hasher.checks == codes.count(302)  # a refusal checks no password
    # At once over, the right password signs in at the first try.
    response, session = _sign_in(live_server.url, "carol")
    assert response.status_code == 302 and "sessionid" in session.cookies


# -- The reserve API, interleaved by hand -----------------------------------------------------------------------


@pytest.fixture
def limits(settings):
    settings.LOGIN_THROTTLE_ATTEMPTS = 3
    settings.LOGIN_THROTTLE_WINDOW = 300
    settings.LOGIN_THROTTLE_IN_FLIGHT = 4
    settings.LOGIN_THROTTLE_BUSY_RETRY = 5
    settings.LOGIN_THROTTLE_ADDRESS_ATTEMPTS = 6
    return settings


def test_checks_in_flight_from_one_address_never_count_as_failures(limits) -> None:
    ip = "10.2.0.1"
    # Four right passwords in flight at once (more than the three failures allowed): all reserved.
    assert [login_reserve(username=f"u{n}", ip=ip) for n in range(4)] == [None] * 4
    # A fifth at the same moment waits a few seconds, with its own message; nothing is blocked.
    busy = login_reserve(username="u4", ip=ip)
    assert busy == Blocked(retry_after=5, reason=BUSY)
    assert busy.message == "Too many sign-ins at once from your network; try again in a few seconds."
    login_succeeded(username="u0", ip=ip)
    assert login_reserve(username="u4", ip=ip) is None
    for n in range(1, 5):
        login_succeeded(username=f"u{n}", ip=ip)
    # Many more right passwords, in overlapping pairs, all go through: the address has no failures.
    for n in range(20):
        assert login_reserve(username=f"v{n}", ip=ip) is None
        assert login_reserve(username=f"w{n}", ip=ip) is None
        login_succeeded(username=f"v{n}", ip=ip)
        login_succeeded(username=f"w{n}", ip=ip)
    row = LoginThrottle.objects.get(key=f"ip:{ip}")
    assert (row.attempts, row.in_flight, row.blocked_until) == (0, 0, 0)


def test_failures_from_one_address_lock_it_after_its_own_higher_limit(limits) -> None:
    ip = "10.2.0.2"
    # Password spraying: one wrong guess each for many usernames; no pair reaches its limit of 3.
    for n in range(5):
        assert login_reserve(username=f"g{n}", ip=ip) is None
        assert login_failed(username=f"g{n}", ip=ip) is None
    assert login_reserve(username="g5", ip=ip) is None
    blocked = login_failed(username="g5", ip=ip)
    assert blocked == Blocked(retry_after=300, reason=FAILED, scope=ADDRESS)
    assert blocked.message == ("Too many failed sign-in attempts from your network address, for any username. "
                               "Sign-in from this address is paused for 5 minutes; please try again later.")
    refused = login_reserve(username="someone-else", ip=ip)  # any username from the address
    assert refused is not None and (refused.reason, refused.scope) == (FAILED, ADDRESS)
    assert login_reserve(username="someone-else", ip="10.2.0.3") is None  # another address is free


def test_a_username_from_one_address_allows_the_limit_of_checks_at_once_then_waits_a_few_seconds(limits) -> None:
    ip = "10.3.0.1"
    # A pair's checks in flight count against its limit (parallel guesses get at most 3 checks) ...
    assert [login_reserve(username="carol", ip=ip) for _ in range(3)] == [None] * 3
    busy = login_reserve(username="carol", ip=ip)
    assert busy is not None and busy.reason == BUSY and busy.retry_after == 5
    # ... but a right password among them never locks her out.
    login_succeeded(username="carol", ip=ip)
    assert login_reserve(username="carol", ip=ip) is None
    # Wrong ones do: the remaining three fail, and carol is paused from this address for the window.
    results = [login_failed(username="carol", ip=ip) for _ in range(3)]
    assert results[-1] == Blocked(retry_after=300, reason=FAILED, scope=ACCOUNT)
    assert results[-1].message == (
        "Too many failed sign-in attempts for this username from your network address. Sign-in with this "
        "username from this address is paused for 5 minutes; please try again later.")
    assert login_reserve(username="CAROL", ip=ip).scope == ACCOUNT  # usernames are compared without case
    # Not carol from elsewhere, nor anyone else from here.
    assert login_reserve(username="carol", ip="10.3.0.50") is None
    assert login_reserve(username="alice", ip=ip) is None


def test_a_reservation_left_by_a_dead_process_is_forgotten(limits, monkeypatch) -> None:
    ip = "10.4.0.1"
    for n in range(4):
        assert login_reserve(username=f"d{n}", ip=ip) is None  # the process dies: never succeeded nor failed
    assert login_reserve(username="d4", ip=ip).reason == BUSY
    later = time.time() + IN_FLIGHT_TTL + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert login_reserve(username="d4", ip=ip) is None


def test_the_sign_in_form_says_when_too_many_sign_ins_run_at_once(client, cast, limits) -> None:
    limits.LOGIN_THROTTLE_IN_FLIGHT = 1
    assert login_reserve(username="alice", ip="10.5.0.1") is None  # someone else behind the same NAT, mid-check
    response = client.post("/accounts/login/", {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.5.0.1")
    assert response.status_code == 200
    assert "Too many sign-ins at once from your network; try again in a few seconds." in response.content.decode()
    assert "_auth_user_id" not in client.session
    login_succeeded(username="alice", ip="10.5.0.1")
    response = client.post("/accounts/login/", {"username": "carol", "password": PASSWORD}, REMOTE_ADDR="10.5.0.1")
    assert response.status_code == 302


# -- Through the sign-in page: one person's wrong passwords pause only them ---------------------------------------


def _login(client, username: str, password: str, ip: str):
    return client.post("/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=ip)


def test_wrong_passwords_for_one_username_do_not_lock_out_others_behind_the_address(client, cast, settings) -> None:
    settings.LOGIN_THROTTLE_ATTEMPTS = 5
    settings.LOGIN_THROTTLE_WINDOW = 300
    office = "10.9.0.1"
    for _ in range(5):
        assert _login(client, "frank", "wrong", office).status_code == 200
    # frank, even with the right password, is paused from this address, and is told what and for how long.
    response = _login(client, "frank", PASSWORD, office)
    body = response.content.decode()
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert "for this username from your network address" in body and "paused for 5 minutes" in body
    # ops, behind the same address, signs in at once; so does frank from home.
    assert _login(client, "ops", PASSWORD, office).status_code == 302
    client.logout()
    assert _login(client, "frank", PASSWORD, "10.9.9.9").status_code == 302


def test_password_spraying_from_one_address_pauses_the_address_with_its_own_message(client, cast, settings) -> None:
    settings.LOGIN_THROTTLE_ATTEMPTS = 5
    settings.LOGIN_THROTTLE_ADDRESS_ATTEMPTS = 12
    spray = "10.9.1.1"
    names = ["ops", "alice", "bob", "carol", "dave", "erin"]
    for n in range(12):
        assert _login(client, names[n % len(names)], f"Spring2026-{n}", spray).status_code == 200
    response = _login(client, "nobody", PASSWORD, spray)
    body = response.content.decode()
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert "from your network address, for any username" in body and "paused for 5 minutes" in body
    assert _login(client, "nobody", PASSWORD, "10.9.1.2").status_code == 302  # elsewhere: not paused
