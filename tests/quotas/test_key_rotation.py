"""Rotating the keys (docs/operations.md): the Fernet key with ``PORTAL_ENCRYPTION_KEY=NEW,OLD`` and
``manage.py reencrypt_kubeconfigs``, and SECRET_KEY with ``SECRET_KEY_FALLBACKS`` (sessions survive; kubeconfigs
encrypted with the derived key stay readable). The sandbox cluster answers through the re-encrypted kubeconfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.management import CommandError, call_command
from django.test import Client

from portal.crypto import InvalidToken, decrypt, encrypt
from portal.kube import kube_for
from quotas.models import Cluster

pytestmark = pytest.mark.django_db


def test_fernet_key_rotation_reencrypts_every_kubeconfig(settings, sandbox_cluster) -> None:
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.PORTAL_ENCRYPTION_KEY = old
    text = Path(sandbox_cluster.kubeconfig).read_text()
    cluster = Cluster.objects.create(name="rotated", architecture="B", kubeconfig_encrypted=encrypt(text))
    before = cluster.kubeconfig_encrypted

    settings.PORTAL_ENCRYPTION_KEY = f"{new},{old}"  # step 1: the new key first, the old one still reads
    assert decrypt(before) == text
    call_command("reencrypt_kubeconfigs")  # step 2
    cluster.refresh_from_db()
    assert cluster.kubeconfig_encrypted != before

    settings.PORTAL_ENCRYPTION_KEY = new  # step 3: the old key goes
    assert decrypt(cluster.kubeconfig_encrypted) == text
    assert kube_for(cluster).list("v1", "Namespace")[0]  # the cluster answers through it
    with pytest.raises(InvalidToken):
        decrypt(before)
    settings.PORTAL_ENCRYPTION_KEY = old
    with pytest.raises(InvalidToken):
        decrypt(cluster.kubeconfig_encrypted)


def test_reencrypt_names_the_kubeconfigs_no_key_opens(settings) -> None:
    settings.PORTAL_ENCRYPTION_KEY = Fernet.generate_key().decode()
    Cluster.objects.create(name="lost-key", architecture="B", kubeconfig_encrypted=encrypt("apiVersion: v1\n"))
    settings.PORTAL_ENCRYPTION_KEY = Fernet.generate_key().decode()
    with pytest.raises(CommandError, match="lost-key"):
        call_command("reencrypt_kubeconfigs")


def test_secret_key_rotation_keeps_sessions_and_derived_kubeconfigs(settings, cast) -> None:
    settings.PORTAL_ENCRYPTION_KEY = ""
    old = "old-secret-key-" + "x" * 40
    settings.SECRET_KEY = old
    token = encrypt("apiVersion: v1\n")
    active, away = Client(), Client()
    active.force_login(cast.carol)
    away.force_login(cast.dave)

    settings.SECRET_KEY, settings.SECRET_KEY_FALLBACKS = "new-secret-key-" + "y" * 40, [old]
    assert active.get("/requests/").status_code == 200  # still signed in (and the session moves to the new key)
    assert decrypt(token) == "apiVersion: v1\n"  # the derived kubeconfig key of the old SECRET_KEY still reads

    settings.SECRET_KEY_FALLBACKS = []
    assert active.get("/requests/").status_code == 200  # came by during the rotation: kept
    assert away.get("/requests/").status_code == 302  # did not: signed out once the old key is gone
    with pytest.raises(InvalidToken):
        decrypt(token)
