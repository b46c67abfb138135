"""The WSGI application leaves what startup loaded out of the garbage collector's full collections, and paces its
collections between requests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

PROBE = """
import gc
import portal.wsgi
from django.urls import get_resolver
frozen = gc.get_freeze_count()
gc.collect()
print(frozen, len(gc.get_objects(generation=2)), get_resolver().url_patterns is not None, gc.get_threshold()[0])
"""


def test_a_full_collection_no_longer_walks_the_loaded_application() -> None:
    env = os.environ | {"DJANGO_SETTINGS_MODULE": "portal.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    frozen, left, routed, threshold = int(out[0]), int(out[1]), out[2], int(out[3])
    # Django, the apps, their views (the URLconf is loaded first) and templates' code: frozen, not walked again.
    assert frozen > 50_000, frozen
    assert left < frozen // 10, (left, frozen)
    assert routed == "True"
    assert threshold == 50_000  # collections between requests (portal/gc_pacing.py)
