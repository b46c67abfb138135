from __future__ import annotations

import pytest

from tests.workloads.factories import Catalogue, make_catalogue


@pytest.fixture
def cat(cast) -> Catalogue:
    return make_catalogue(cast)
