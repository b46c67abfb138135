"""Settings of the beat-singleton test (tests/deploy/test_singletons.py): the production settings with a fast
schedule and the broker's keys under a prefix of the test's own."""

import os

from portal.settings import *  # noqa: F403

CELERY_BEAT_SCHEDULE = {
    "every-second": {"task": "portal.ping", "schedule": 1.0},
    "every-3-seconds": {"task": "portal.ping", "schedule": 3.0, "options": {"queue": "slow"}},
}
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": os.environ["BEAT_TEST_PREFIX"]}
