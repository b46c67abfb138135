"""Single sign-on with OpenID Connect, on mozilla-django-oidc (docs/security.md "Single sign-on").

The library runs the authorization code flow with PKCE, keeps state, nonce and code verifier in the session
(one entry per sign-in, removed when used) and checks the nonce. This module adds what the portal needs:

* configuration from settings only (``OIDC_*``, portal/settings.py); the endpoints from the issuer's discovery
  document (cached ``OIDC_DISCOVERY_TTL`` seconds, its ``issuer`` must be the configured one) unless set;
* the identity token's signature against the provider's JWKS (cached; fetched again when a token names a key
  it does not hold, so keys can rotate), and its issuer, audience (and ``azp``), expiry and issue time;
* the userinfo answer must be about the token's subject;
* users by (issuer, subject), never by email; roles from the groups claim (``tenants.identity``);
* refusals shown on the sign-in page, never a server error; RP-initiated logout where the provider has it.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any
from urllib.parse import urlencode

import jwt
import requests
from django.conf import settings
from django.contrib import auth, messages
from django.contrib.auth.views import LogoutView
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured, SuspiciousOperation
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from . import identity
from .access import client_address, user_for_session

logger = logging.getLogger(__name__)

# mozilla-django-oidc's setting -> the discovery document's field.
DISCOVERED = {
    "OIDC_OP_AUTHORIZATION_ENDPOINT": "authorization_endpoint",
    "OIDC_OP_TOKEN_ENDPOINT": "token_endpoint",
    "OIDC_OP_USER_ENDPOINT": "userinfo_endpoint",
    "OIDC_OP_JWKS_ENDPOINT": "jwks_uri",
    "OIDC_OP_LOGOUT_ENDPOINT": "end_session_endpoint",
}
INVITATION_SESSION_KEY = "tenants:sso-invitation"
ID_TOKEN_SESSION_KEY = "oidc_id_token"


class SignInRefused(SuspiciousOperation):
    """The provider's answer failed a check: the sign-in is refused and the page says why."""


def sso_enabled() -> bool:
    return bool(getattr(settings, "OIDC_ISSUER", "") and getattr(settings, "OIDC_RP_CLIENT_ID", ""))


def provider_name() -> str:
    return str(getattr(settings, "OIDC_PROVIDER_NAME", "") or "single sign-on")


def _key(kind: str, value: str) -> str:
    return f"oidc:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:32]}"


def discovery() -> dict[str, Any]:
    """The issuer's ``.well-known/openid-configuration``, cached. Its ``issuer`` must be ours exactly."""
    issuer = settings.OIDC_ISSUER
    key = _key("discovery", issuer)
    document = cache.get(key)
    if document is None:
        url = issuer.rstrip("/") + "/.well-known/openid-configuration"
        response = requests.get(url, timeout=getattr(settings, "OIDC_TIMEOUT", 10))
        response.raise_for_status()
        document = response.json()
        if document.get("issuer") != issuer:
            raise ImproperlyConfigured(f"{url} names issuer {document.get('issuer')!r}, not {issuer!r}.")
        cache.set(key, document, getattr(settings, "OIDC_DISCOVERY_TTL", 3600))
    return document


def oidc_setting(attr: str, *default: Any) -> Any:
    """mozilla-django-oidc's settings: an endpoint set explicitly, else the discovered one; the rest as set."""
    if attr in DISCOVERED:
        explicit = getattr(settings, attr, "")
        if explicit:
            return explicit
        found = discovery().get(DISCOVERED[attr])
        if found:
            return found
        if default:
            return default[0]
        raise ImproperlyConfigured(f"The provider's discovery document has no {DISCOVERED[attr]}; set {attr}.")
    return import_from_settings(attr, *default)


def jwks(url: str, *, fresh: bool = False) -> dict[str, Any]:
    """The provider's signing keys, cached; ``fresh`` fetches them again (a token named a key we lack)."""
    key = _key("jwks", url)
    keys = None if fresh else cache.get(key)
    if keys is None:
        response = requests.get(url, timeout=getattr(settings, "OIDC_TIMEOUT", 10))
        response.raise_for_status()
        keys = response.json()
        cache.set(key, keys, getattr(settings, "OIDC_DISCOVERY_TTL", 3600))
    return keys


def groups_of(claims: dict[str, Any]) -> list[str]:
    """The groups claim (``OIDC_GROUPS_CLAIM``; a dotted name reaches into objects, e.g. Keycloak's
    ``realm_access.roles``) as a list of strings."""
    value: Any = claims
    for part in str(settings.OIDC_GROUPS_CLAIM).split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [str(item).lstrip("/") for item in value if isinstance(item, (str, int))]
    return []


class PortalOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with the portal's checks and identities. Its settings are read at sign-in
    (a password sign-in never asks the provider anything)."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> Any:
        if request is None or not sso_enabled() or "code_verifier" not in kwargs:
            return None
        if not (request.GET.get("code") and request.GET.get("state")):
            return None
        super().__init__()
        return super().authenticate(request, **kwargs)

    # The identity token -------------------------------------------------------------------------

    def retrieve_matching_jwk(self, token: Any) -> Any:
        header = jwt.get_unverified_header(token)
        kid, alg = header.get("kid"), header.get("alg")
        for fresh in (False, True):
            for jwk in jwks(self.OIDC_OP_JWKS_ENDPOINT, fresh=fresh).get("keys", []):
                if kid is not None and jwk.get("kid") != kid:
                    continue
                if jwk.get("alg", alg) != alg or jwk.get("use", "sig") != "sig":
                    continue
                return jwt.PyJWK(jwk)
        raise SignInRefused("The identity token is signed with a key the provider does not publish.")

    def _verify_jws(self, payload: Any, key: Any) -> dict[str, Any]:
        try:
            alg = jwt.get_unverified_header(payload).get("alg")
        except jwt.InvalidTokenError:
            raise SignInRefused("The identity token is not a signed token.") from None
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise SignInRefused(f"The identity token is signed with {alg}, not {self.OIDC_RP_SIGN_ALGO}.")
        try:
            claims = jwt.decode(
                payload, key, algorithms=[alg], audience=self.OIDC_RP_CLIENT_ID, issuer=settings.OIDC_ISSUER,
                leeway=getattr(settings, "OIDC_CLOCK_SKEW", 60),
                options={"require": ["iss", "aud", "exp", "iat", "sub"]},
            )
        except jwt.ExpiredSignatureError:
            raise SignInRefused("The identity token has expired.") from None
        except jwt.InvalidAudienceError:
            raise SignInRefused("The identity token was issued for another application.") from None
        except jwt.InvalidIssuerError:
            raise SignInRefused("The identity token comes from another issuer.") from None
        except jwt.ImmatureSignatureError:
            raise SignInRefused("The identity token is dated in the future.") from None
        except jwt.InvalidSignatureError:
            raise SignInRefused("The identity token's signature does not verify.") from None
        except jwt.InvalidTokenError as exc:
            raise SignInRefused(f"The identity token is invalid ({exc}).") from None
        audience = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audience) > 1 and claims.get("azp") != self.OIDC_RP_CLIENT_ID:
            raise SignInRefused("The identity token was issued for another application (azp).")
        return claims

    def verify_token(self, token: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return super().verify_token(token, **kwargs)
        except SignInRefused:
            raise
        except SuspiciousOperation as exc:
            message = "The identity token does not answer this sign-in (nonce)." if "Nonce" in str(exc) else str(exc)
            raise SignInRefused(message) from None

    # Claims and users --------------------------------------------------------------------------

    def get_userinfo(self, access_token: str, id_token: str, payload: dict[str, Any]) -> dict[str, Any]:
        """The identity token's claims, completed by the userinfo endpoint's (which must be about the same subject)."""
        claims = dict(payload)
        if self.OIDC_OP_USER_ENDPOINT and access_token:
            info = super().get_userinfo(access_token, id_token, payload)
            if info.get("sub") != payload.get("sub"):
                raise SignInRefused("The provider's userinfo is about someone else.")
            claims.update({k: v for k, v in info.items() if k not in ("iss", "aud", "exp", "iat", "nonce")})
        self._claims = claims  # the sign-in's claims, for the roles (get_or_create_user)
        return claims

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> Any:
        return self.UserModel.objects.filter(oidc_identities__issuer=claims["iss"], oidc_identities__subject=claims["sub"])

    def _email(self, claims: dict[str, Any]) -> str:
        """The address, only when the provider vouches for it (``email_verified``)."""
        email = claims.get(settings.OIDC_EMAIL_CLAIM) or ""
        return str(email).strip().lower() if email and claims.get("email_verified") is True else ""

    def create_user(self, claims: dict[str, Any]) -> Any:
        wanted = claims.get(settings.OIDC_USERNAME_CLAIM) or claims.get("email") or claims["sub"]
        return identity.identity_user_create(
            issuer=claims["iss"], subject=claims["sub"], username=str(wanted), email=self._email(claims),
            ip=client_address(self.request),
        )

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        return user

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> Any:
        user = super().get_or_create_user(access_token, id_token, payload)
        if user is None or not user.is_active:
            return user
        claims = self._claims
        session = self.request.session
        result = identity.identity_sync(
            user=user, issuer=claims["iss"], subject=claims["sub"], claims=claims, groups=groups_of(claims),
            invitation_secret=session.pop(INVITATION_SESSION_KEY, None),
            verified_email=self._email(claims), ip=client_address(self.request),
        )
        user._portal_sso_result = result
        return user

    def get_user(self, user_id: Any) -> Any:
        user = user_for_session(user_id)
        return user if user is not None and self.user_can_authenticate(user) else None


# Views ---------------------------------------------------------------------------------------------


class SignInView(OIDCAuthenticationRequestView):
    """"Sign in with <provider>": to the provider's authorization endpoint with state, nonce and PKCE."""

    get_settings = staticmethod(oidc_setting)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            return redirect("login")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = oidc_setting("OIDC_OP_AUTHORIZATION_ENDPOINT")
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            logger.warning("single sign-on: the provider's discovery failed: %s", exc)
            messages.error(request, f"{provider_name()} cannot be reached just now. Try again in a moment.")
            return redirect("login")
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID
        return super().get(request)


class CallbackView(OIDCAuthenticationCallbackView):
    """The provider's answer. Anything wrong (state, nonce, signature, audience, expiry, a code used twice, the
    provider unreachable) is a refusal on the sign-in page, logged; nobody is signed in."""

    get_settings = staticmethod(oidc_setting)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not sso_enabled():
            return redirect("login")
        if "code" in request.GET and request.GET.get("state") not in (request.session.get("oidc_states") or {}):
            logger.warning("single sign-on refused: unknown state (forged, or the answer was used already)")
            return self._refused("The sign-in answer does not belong to a sign-in started here (state).")
        try:
            response = super().get(request)
        except SignInRefused as exc:
            logger.warning("single sign-on refused: %s", exc)
            return self._refused(str(exc))
        except SuspiciousOperation as exc:
            logger.warning("single sign-on refused: %s", exc)
            return self._refused("The provider's answer failed a check.")
        except requests.HTTPError as exc:
            logger.warning("single sign-on refused by the provider: %s", exc)
            return self._refused("The provider refused the sign-in code (it may have been used already).")
        except (requests.RequestException, ValueError, ImproperlyConfigured) as exc:
            logger.warning("single sign-on failed: %s", exc)
            return self._refused(f"{provider_name()} cannot be reached just now.")
        return response

    def _refused(self, why: str) -> HttpResponse:
        if self.request.user.is_authenticated:
            auth.logout(self.request)
        messages.error(self.request, f"Sign-in with {provider_name()} refused: {why}")
        return redirect("login")

    def login_failure(self) -> HttpResponse:
        if self.request.GET.get("error"):
            return self._refused(self.request.GET.get("error_description") or self.request.GET["error"])
        return self._refused("the provider did not sign you in.")

    def login_success(self) -> HttpResponse:
        response = super().login_success()
        result = getattr(self.user, "_portal_sso_result", None)
        if result is not None:
            for where in result.invitations:
                messages.success(self.request, f"Welcome: you joined {where} by invitation.")
            if result.removed:
                messages.warning(self.request, "Your groups changed: you are no longer " + "; ".join(result.removed) + ".")
        return response


def invitation_sign_in(request: HttpRequest, secret: str) -> HttpResponse:
    """An invitation's "Sign in with <provider>": the link rides in the session to the first sign-in, which
    takes the invitation for the identity that signs in."""
    request.session[INVITATION_SESSION_KEY] = secret
    return redirect(reverse("oidc-login") + "?" + urlencode({"next": reverse("home")}))


class PortalLogoutView(LogoutView):
    """Sign out here; after a single sign-on session, also at the provider (RP-initiated logout) when its
    discovery document has an ``end_session_endpoint``. A page leads there (the sign-out form's page allows
    forms only to the portal itself: Content-Security-Policy ``form-action``)."""

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        id_token = request.session.get(ID_TOKEN_SESSION_KEY)
        end_session = None
        if id_token and sso_enabled():
            try:
                end_session = oidc_setting("OIDC_OP_LOGOUT_ENDPOINT", None)
            except (requests.RequestException, ValueError, ImproperlyConfigured):
                end_session = None
        response = super().post(request, *args, **kwargs)
        if not end_session:
            return response
        back = request.build_absolute_uri(reverse(settings.LOGOUT_REDIRECT_URL))
        url = end_session + ("&" if "?" in end_session else "?") + urlencode(
            {"id_token_hint": id_token, "post_logout_redirect_uri": back, "client_id": settings.OIDC_RP_CLIENT_ID})
        if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
            return response
        return render(request, "registration/sso_logout.html", {"end_session_url": url, "provider": provider_name()})

