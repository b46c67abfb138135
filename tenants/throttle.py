"""Login throttling for every sign-in form (the portal's and the Django admin's).

Failed sign-ins are counted per (username, client address) and per client address
(docs/security.md, "Sign-in throttling"):

- ``settings.LOGIN_THROTTLE_ATTEMPTS`` failures within ``settings.LOGIN_THROTTLE_WINDOW`` seconds for one
  username *from one address* pause that username from that address for one window: the owner of the
  account, or anyone else, signing in from another address is not affected, and neither is anyone else
  behind the same address (one person's typos no longer lock out a whole office behind one NAT);
- ``settings.LOGIN_THROTTLE_ADDRESS_ATTEMPTS`` failures (much more, default 50) from one address, whatever the
  usernames, pause the address for every username: password spraying, one guess per many accounts.

Only wrong passwords count; a right password never locks anyone out. The refusal says which pause it is
(this username from this address, or this address) and for how long.

It sits in the authentication backend (``ThrottledModelBackend``), so every password check made
through ``django.contrib.auth.authenticate`` goes through it, whichever form asked. The counts live
in the database (``LoginThrottle``, one row per (username, address) pair and per address: ``attempts`` the
failures of the window, ``in_flight`` the password checks running now) and are changed only under a row
lock, in a transaction of their own:

1. before the password is checked, the check is *reserved* (``in_flight`` + 1 on each key), or the
   sign-in is refused without checking the password:
   - a blocked key refuses for the rest of its block;
   - a pair refuses while its failures plus its checks in flight reach the limit, so however many
     guesses arrive at once, in however many processes, at most ``LOGIN_THROTTLE_ATTEMPTS`` passwords
     are checked per username, address and window;
   - an address refuses while ``LOGIN_THROTTLE_IN_FLIGHT`` of its checks are in flight (a class behind
     one NAT, a load test), or its failures reach its limit.
   A refusal by checks in flight says "Too many sign-ins at once from your network" and asks to retry
   in ``LOGIN_THROTTLE_BUSY_RETRY`` seconds: the checks end in well under that;
2. a wrong password turns its reservation into a failure, and the last one blocks the key;
3. a right password ends its reservation and clears the pair's failures (an address keeps its failures:
   one good password must not reset a guesser working through many usernames from one address).

Attempts refused are not counted, so a blocked key is free again when the window ends. Checks in flight
older than ``IN_FLIGHT_TTL`` seconds are forgotten (a process that died mid-check cannot hold a slot).
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
from django.db.models import Q
from django.http import HttpRequest

from .access import client_address, user_for_session
from .models import LoginThrottle

# A password check takes well under a second; a reservation older than this was left by a dead process.
IN_FLIGHT_TTL = 60.0

FAILED = "failed"
BUSY = "busy"


ACCOUNT = "account"
ADDRESS = "address"


@dataclass(frozen=True)
class Blocked:
    """A refusal: why (``FAILED``: too many wrong passwords; ``BUSY``: too many checks at once), how many
    seconds are left before the next attempt is allowed, and what is paused (``ACCOUNT``: this username from
    this address; ``ADDRESS``: this address, for every username)."""

    retry_after: int
    reason: str = FAILED
    scope: str = ACCOUNT

    @property
    def message(self) -> str:
        if self.reason == BUSY:
            return "Too many sign-ins at once from your network; try again in a few seconds."
        minutes = max(1, math.ceil(self.retry_after / 60))
        unit = "minute" if minutes == 1 else "minutes"
        if self.scope == ADDRESS:
            return (f"Too many failed sign-in attempts from your network address, for any username. Sign-in from "
                    f"this address is paused for {minutes} {unit}; please try again later.")
        return (f"Too many failed sign-in attempts for this username from your network address. Sign-in with "
                f"this username from this address is paused for {minutes} {unit}; please try again later.")


def _pair_key(username: str, ip: str | None) -> str:
    # Hash the username (and address): keys must be short and safe whatever people type.
    name = username.strip().lower()
    if not ip:
        return "user:" + hashlib.sha256(name.encode()).hexdigest()[:32]
    return "pair:" + hashlib.sha256(f"{name}\n{ip}".encode()).hexdigest()[:32]


def _keys(*, username: str, ip: str | None) -> list[str]:
    keys = [_pair_key(username, ip)]
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


def _fresh(row: LoginThrottle, now: float) -> None:
    """Start a new window of failures when the last one is over; forget checks in flight left by dead processes."""
    if row.window_start <= now - settings.LOGIN_THROTTLE_WINDOW:
        row.attempts, row.window_start = 0, now
    if row.in_flight and row.in_flight_since <= now - IN_FLIGHT_TTL:
        row.in_flight = 0


def login_reserve(*, username: str, ip: str | None) -> Blocked | None:
    """Reserve one password check on the (username, address) pair and the address, or a ``Blocked`` (nothing
    reserved)."""
    now = time.time()
    window = settings.LOGIN_THROTTLE_WINDOW
    pair_key = _pair_key(username, ip)
    with transaction.atomic():
        rows = _locked_rows(_keys(username=username, ip=ip))
        blocked: dict[str, float] = {}
        busy = False
        for row in rows:
            _fresh(row, now)
            scope = ACCOUNT if row.key == pair_key else ADDRESS
            if row.blocked_until > now:
                blocked[scope] = row.blocked_until - now
            elif scope == ACCOUNT:
                busy = busy or row.attempts + row.in_flight >= settings.LOGIN_THROTTLE_ATTEMPTS
            elif row.attempts >= settings.LOGIN_THROTTLE_ADDRESS_ATTEMPTS:
                # Only reachable when the failures were counted under an older limit.
                blocked[scope] = row.window_start + window - now
            else:
                busy = busy or row.in_flight >= settings.LOGIN_THROTTLE_IN_FLIGHT
        if blocked:
            # The wider pause first: an address paused for everyone says so, even if the pair is paused too.
            scope = ADDRESS if ADDRESS in blocked else ACCOUNT
            return Blocked(retry_after=math.ceil(blocked[scope]), reason=FAILED, scope=scope)
        if busy:
            return Blocked(retry_after=settings.LOGIN_THROTTLE_BUSY_RETRY, reason=BUSY)
        for row in rows:
            row.in_flight += 1
            row.in_flight_since = now
            row.save(update_fields=["attempts", "window_start", "in_flight", "in_flight_since"])
    return None


def login_failed(*, username: str, ip: str | None) -> Blocked | None:
    """The reserved check failed: count a failure; returns a ``Blocked`` when it was the last one allowed."""
    now = time.time()
    window = settings.LOGIN_THROTTLE_WINDOW
    pair_key = _pair_key(username, ip)
    blocked = None
    with transaction.atomic():
        for row in _locked_rows(_keys(username=username, ip=ip)):
            _fresh(row, now)
            row.in_flight = max(0, row.in_flight - 1)
            scope = ACCOUNT if row.key == pair_key else ADDRESS
            limit = settings.LOGIN_THROTTLE_ATTEMPTS if scope == ACCOUNT else settings.LOGIN_THROTTLE_ADDRESS_ATTEMPTS
            if row.blocked_until <= now:
                row.attempts += 1
                if row.attempts >= limit:
                    row.blocked_until, row.attempts, row.window_start = now + window, 0, now
                    if blocked is None or scope == ADDRESS:
                        blocked = Blocked(retry_after=window, reason=FAILED, scope=scope)
            row.save(update_fields=["blocked_until", "attempts", "window_start", "in_flight"])
    return blocked


def login_succeeded(*, username: str, ip: str | None) -> None:
    """The reserved check succeeded: end it, and clear the pair's failures (not the address's)."""
    now = time.time()
    pair_key = _pair_key(username, ip)
    with transaction.atomic():
        for row in _locked_rows(_keys(username=username, ip=ip)):
            row.in_flight = max(0, row.in_flight - 1)
            if row.key == pair_key:
                row.attempts = 0
            row.save(update_fields=["attempts", "in_flight"])
    # Forget rows that count nothing any more (rows someone holds are left for next time).
    stale = LoginThrottle.objects.filter(
        Q(in_flight=0) | Q(in_flight_since__lt=now - IN_FLIGHT_TTL),
        window_start__lt=now - settings.LOGIN_THROTTLE_WINDOW,
        blocked_until__lt=now,
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


# -- Sign-up on an invitation's page ---------------------------------------------------------------------------
# Counted in the cache per fixed window: ``SIGNUP_THROTTLE_ATTEMPTS`` tries per invitation and
# ``SIGNUP_THROTTLE_ADDRESS_ATTEMPTS`` per client address (across invitations), every form sent counting,
# within ``SIGNUP_THROTTLE_WINDOW`` seconds. The usernames offered are not an oracle (selectors.signup_usernames_for);
# this bounds what a leaked link or a script can try at all (passwords, the form itself).


@dataclass(frozen=True)
class SignupBlocked:
    retry_after: int
    scope: str  # "invitation" or ADDRESS

    @property
    def message(self) -> str:
        minutes = max(1, math.ceil(self.retry_after / 60))
        unit = "minute" if minutes == 1 else "minutes"
        what = "on this invitation" if self.scope == "invitation" else "from your network address"
        return f"Too many sign-up attempts {what}. Try again in {minutes} {unit}."


def _window_count(key: str, window: int) -> int:
    from django.core.cache import cache

    cache.add(key, 0, timeout=window + 5)
    try:
        return cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.add(key, 1, timeout=window + 5)
        return 1


def signup_attempt(*, invitation_id: int, ip: str | None) -> SignupBlocked | None:
    """Count one sign-up attempt on the invitation from the address; a ``SignupBlocked`` when over a limit."""
    window = settings.SIGNUP_THROTTLE_WINDOW
    now = time.time()
    slot = int(now // window)
    retry = math.ceil((slot + 1) * window - now)
    if _window_count(f"signup:inv:{invitation_id}:{slot}", window) > settings.SIGNUP_THROTTLE_ATTEMPTS:
        return SignupBlocked(retry_after=retry, scope="invitation")
    if ip and _window_count(f"signup:ip:{ip}:{slot}", window) > settings.SIGNUP_THROTTLE_ADDRESS_ATTEMPTS:
        return SignupBlocked(retry_after=retry, scope=ADDRESS)
    return None
