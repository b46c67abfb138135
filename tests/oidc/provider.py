"""The test OpenID provider (tests/oidc/server.js, the npm ``oidc-provider`` package) as pytest fixtures.

``oidc_server`` starts one provider per test session (``npm ci`` first when node_modules is missing); ``sso``
points the portal's settings at it for one test. Tests change users, groups, keys and the provider's behaviour
through its admin API (``OidcProvider``). Test modules import the fixtures they use from here.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
import requests

HERE = Path(__file__).resolve().parent
CLIENT_ID = "portal"
CLIENT_SECRET = "portal-test-secret"
PROVIDER_NAME = "Test IdP"


class OidcProvider:
    def __init__(self, issuer: str) -> None:
        self.issuer = issuer

    def _call(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.issuer + path, data=data, method="GET" if body is None else "POST",
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as response:
            return json.loads(response.read())

    def user(self, sub: str, *, groups: list[str], email: str | None = None, email_verified: bool = True,
             username: str | None = None, name: str | None = None) -> None:
        """Create or replace the provider's user ``sub`` (their groups take effect at their next sign-in)."""
        self._call("/__test/users", {"sub": sub, "groups": groups, "email": email or f"{sub}@idp.example",
                                     "email_verified": email_verified, "preferred_username": username or sub,
                                     "name": name or sub.title()})

    def rotate(self) -> str:
        """A new signing key; returns its kid."""
        return self._call("/__test/rotate", {})["kid"]

    def mode(self, mode: str) -> None:
        """Spoil the next token responses: "bad-signature", "wrong-audience", "expired", "wrong-nonce", "wrong-issuer"."""
        self._call("/__test/mode", {"mode": mode})

    def client(self, *bases: str) -> None:
        self._call("/__test/client", {
            "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET,
            "redirect_uris": [f"{b}/oidc/callback/" for b in bases],
            "post_logout_redirect_uris": [f"{b}/accounts/login/" for b in bases],
        })

    def state(self) -> dict[str, Any]:
        return self._call("/__test/state")


def _start() -> tuple[subprocess.Popen[str], str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.fail("node and npm are needed for the single sign-on tests (the test provider is oidc-provider).",
                    pytrace=False)
    # Test workers (xdist) start at the same time: one installs, the others wait for it under the lock.
    with open(HERE / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (HERE / "node_modules" / ".installed").exists():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=HERE, check=True, capture_output=True, timeout=300)
            (HERE / "node_modules" / ".installed").touch()
    proc = subprocess.Popen([node, "server.js", "--port", "0"], cwd=HERE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    issuer = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening "):
            issuer = line.split()[1]
            break
    if not issuer:
        proc.kill()
        pytest.fail("the test OpenID provider did not start", pytrace=False)
    # Keep reading its output so a full pipe never blocks it.
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    return proc, issuer


@pytest.fixture(scope="session")
def oidc_server() -> Iterator[OidcProvider]:
    proc, issuer = _start()
    try:
        yield OidcProvider(issuer)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def sso(oidc_server: OidcProvider, settings: Any) -> Iterator[OidcProvider]:
    """The portal signs in with the test provider (client registered for the Django test client's host)."""
    settings.OIDC_ISSUER = oidc_server.issuer
    settings.OIDC_RP_CLIENT_ID = CLIENT_ID
    settings.OIDC_RP_CLIENT_SECRET = CLIENT_SECRET
    settings.OIDC_RP_SCOPES = "openid email profile groups"
    settings.OIDC_PROVIDER_NAME = PROVIDER_NAME
    oidc_server.client("http://testserver")
    oidc_server.mode("")
    yield oidc_server
    oidc_server.mode("")


def provider_sign_in(authorize_url: str, login: str, *, stop_at: str) -> str:
    """Walk the provider's sign-in like a browser would (``requests``, its own cookies): the authorization
    request, the login form, back to the authorization endpoint; returns the redirect to ``stop_at`` (the
    portal's callback with code and state)."""
    session = requests.Session()
    url = authorize_url
    for _ in range(10):
        response = session.get(url, allow_redirects=False, timeout=10)
        if urlsplit(url).path.startswith("/interaction/") and response.status_code == 200:
            response = session.post(url, data={"login": login}, allow_redirects=False, timeout=10)
        location = response.headers.get("location")
        assert location, f"the provider stopped at {url}: {response.status_code} {response.text[:300]}"
        url = urljoin(url, location)
        if url.startswith(stop_at):
            return url
    raise AssertionError("too many redirects at the provider")
