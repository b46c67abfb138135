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

from tests.factories import PASSWORD

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
