"""Encryption at rest for secrets the portal stores (cluster kubeconfigs).

Fernet (AES-128-CBC + HMAC-SHA256, from ``cryptography``). The key is the ``PORTAL_ENCRYPTION_KEY``
setting or environment variable (a urlsafe-base64 32-byte Fernet key; ``Fernet.generate_key()``), else
it is derived from ``SECRET_KEY`` so a development install needs no extra setting. Rotating
``SECRET_KEY`` without setting ``PORTAL_ENCRYPTION_KEY`` makes stored tokens unreadable: production
should set the dedicated key (or list the old SECRET_KEY in ``SECRET_KEY_FALLBACKS``, whose derived keys still
read). Several keys may be given comma-separated, newest first (MultiFernet): tokens are written with the first
and read with any; ``reencrypt`` (``manage.py reencrypt_kubeconfigs``) moves a token to the first.
"""

from __future__ import annotations

import base64
import hashlib
import os
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

__all__ = ["InvalidToken", "decrypt", "encrypt", "reencrypt"]


def _configured_keys() -> str:
    return str(getattr(settings, "PORTAL_ENCRYPTION_KEY", "") or os.environ.get("PORTAL_ENCRYPTION_KEY", ""))


def _derived(secret_key: str) -> Fernet:
    digest = hashlib.sha256(b"gpu-portal/kubeconfig-encryption/" + secret_key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


@lru_cache(maxsize=8)
def _fernet(keys: str, secret_key: str, fallbacks: tuple[str, ...] = ()) -> MultiFernet:
    if keys.strip():
        return MultiFernet([Fernet(k.strip().encode()) for k in keys.split(",") if k.strip()])
    # Derived from SECRET_KEY, and readable with the keys derived from SECRET_KEY_FALLBACKS during a rotation.
    return MultiFernet([_derived(k) for k in (secret_key, *fallbacks)])


def _box() -> MultiFernet:
    return _fernet(_configured_keys(), str(settings.SECRET_KEY), tuple(getattr(settings, "SECRET_KEY_FALLBACKS", ()) or ()))


def encrypt(text: str) -> str:
    """Encrypt ``text``; the token is ASCII, safe for a TextField."""
    return _box().encrypt(text.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    """Decrypt a token made by :func:`encrypt`; raises ``InvalidToken`` for a wrong key or tampering."""
    return _box().decrypt(token.encode("ascii")).decode("utf-8")


def reencrypt(token: str) -> str:
    """``token`` encrypted again with the first (newest) key, whichever configured key made it (a key rotation:
    docs/operations.md). Raises ``InvalidToken`` when no configured key opens it."""
    return _box().rotate(token.encode("ascii")).decode("ascii")
