"""Login throttling for every sign-in form (the portal's and the Django admin's).

Too many failed sign-ins for one username, or from one client address, block both for a while:
``settings.LOGIN_THROTTLE_ATTEMPTS`` failures within ``settings.LOGIN_THROTTLE_WINDOW`` seconds
block the username (from every address) or the address (for every username) for one window.

It sits in the authentication backend (``ThrottledModelBackend``), so every password check made
through ``django.contrib.auth.authenticate`` goes through it, whichever form asked. The counts live
in the database (``LoginThrottle``, one row per username and per address) and are changed only
under a row lock, in a transaction of their own:

1. before the password is checked, one attempt is *reserved* on each key, or the sign-in is refused
   (without checking the password) when a key is blocked or its attempts are used up, counting the
   checks still in flight. So however many requests arrive at once, in however many processes, at
   most ``LOGIN_THROTTLE_ATTEMPTS`` passwords are checked per window;
2. a wrong password keeps the reservation as a failure, and the last one blocks the key;
3. a right password gives the address its reservation back and clears the username's failures
   (an address keeps its failures: one good password must not reset a guesser working through
   many usernames from the same address).

Attempts refused while blocked are not counted, so a blocked user is free again when the window ends.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import HttpRequest

from .access import client_address, user_for_session
from .models import LoginThrottle


@dataclass(frozen=True)
class Blocked:
    """A refusal: how many seconds are left before the next attempt is allowed."""

    retry_after: int

    @property
    def message(self) -> str:
        minutes = max(1, math.ceil(self.retry_after / 60))
        unit = "minute" if minutes == 1 else "minutes"
        return f"Too many failed sign-in attempts. Sign-in is paused for {minutes} {unit}; please try again later."


def _user_key(username: str) -> str:
    # Hash the username: keys must be short and safe whatever people type.
    return "user:" + hashlib.sha256(username.strip().lower().encode()).hexdigest()[:32]


def _keys(*, username: str, ip: str | None) -> list[str]:
    keys = [_user_key(username)]
    if ip:
        keys.append(f"ip:{ip}")
    return keys


def _locked_rows(keys: list[str]) -> list[LoginThrottle]:
    """The keys' rows, created if missing, locked until the transaction ends (in key order: no deadlocks)."""
    rows = []
    for key in sorted(keys):
        row, _ = LoginThrottle.objects.select_for_update().get_or_create(key=key)
        rows.append(row)
    return rows


def login_reserve(*, username: str, ip: str | None) -> Blocked | None:
    """Reserve one attempt on the username and the address, or a ``Blocked`` (nothing reserved)."""
    now = time.time()
    window = settings.LOGIN_THROTTLE_WINDOW
    limit = settings.LOGIN_THROTTLE_ATTEMPTS
    with transaction.atomic():
        rows = _locked_rows(_keys(username=username, ip=ip))
        wait = 0.0
        for row in rows:
            if row.blocked_until > now:
                wait = max(wait, row.blocked_until - now)
            elif row.window_start <= now - window:
                row.attempts, row.window_start = 0, now
            elif row.attempts >= limit:
                # The attempts are used up by checks still in flight: refuse until the window ends.
                wait = max(wait, row.window_start + window - now)
        if wait > 0:
            return Blocked(retry_after=math.ceil(wait))
        for row in rows:
            row.attempts += 1
            row.save(update_fields=["attempts", "window_start"])
    return None


def login_failed(*, username: str, ip: str | None) -> Blocked | None:
    """The reserved attempt failed; returns a ``Blocked`` when it used up the last attempt."""
    now = time.time()
    window = settings.LOGIN_THROTTLE_WINDOW
    blocked = None
    with transaction.atomic():
        for row in _locked_rows(_keys(username=username, ip=ip)):
            if row.blocked_until <= now and row.attempts >= settings.LOGIN_THROTTLE_ATTEMPTS:
                row.blocked_until, row.attempts, row.window_start = now + window, 0, now
                row.save(update_fields=["blocked_until", "attempts", "window_start"])
                blocked = Blocked(retry_after=window)
    return blocked


def login_succeeded(*, username: str, ip: str | None) -> None:
    """The reserved attempt succeeded: clear the username's failures, give the address its attempt back."""
    now = time.time()
    user_key = _user_key(username)
    with transaction.atomic():
        for row in _locked_rows(_keys(username=username, ip=ip)):
            row.attempts = 0 if row.key == user_key else max(0, row.attempts - 1)
            row.save(update_fields=["attempts"])
    # Forget rows that count nothing any more (rows someone holds are left for next time).
    stale = LoginThrottle.objects.filter(
        window_start__lt=now - settings.LOGIN_THROTTLE_WINDOW, blocked_until__lt=now
    ).select_for_update(skip_locked=True)
    with transaction.atomic():
        LoginThrottle.objects.filter(pk__in=list(stale.values_list("pk", flat=True)[:500])).delete()


class ThrottledModelBackend(ModelBackend):
    """Django's username/password backend behind the throttle.

    A refused attempt raises ``PermissionDenied`` (``authenticate`` then stops and returns None)
    and leaves the ``Blocked`` on ``request.login_blocked`` for the form to explain.
    """

    def authenticate(self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any):
        from django.contrib.auth import get_user_model

        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        if username is None or password is None:
            return None
        ip = client_address(request) if request is not None else None
        blocked = login_reserve(username=username, ip=ip)
        if blocked is not None:
            _tell(request, blocked)
            raise PermissionDenied(blocked.message)
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            _tell(request, login_failed(username=username, ip=ip))
        else:
            login_succeeded(username=username, ip=ip)
        return user

    def get_user(self, user_id: Any) -> Any:
        """The signed-in request's user, read with their ops membership (``access.user_for_session``): one query."""
        user = user_for_session(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None


def _tell(request: HttpRequest | None, blocked: Blocked | None) -> None:
    if request is not None and blocked is not None:
        request.login_blocked = blocked  # type: ignore[attr-defined]
