"""Settings of ``tests/bench/speed.py``: the portal's own, with ``tests/bench/floor.py`` as the URLconf
(the portal's URLs plus the floor under ``/bench/floor/``)."""

from portal.settings import *  # noqa: F403 (the portal's settings, unchanged but for the URLconf)

ROOT_URLCONF = "tests.bench.floor"

import os as _os

# The benchmark's submissions queue real Celery messages; on a shared Redis they carry their own key
# prefix, so no running worker takes them (speed.py deletes them at the end).
if _os.environ.get("SPEED_BROKER_PREFIX") and CELERY_BROKER_URL.startswith("redis"):  # noqa: F405 (from portal.settings)
    CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": _os.environ["SPEED_BROKER_PREFIX"]}
