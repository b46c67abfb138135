from __future__ import annotations

import pytest

from ..workloads.factories import Catalogue, make_catalogue


@pytest.fixture
def cat(cast) -> Catalogue:
    """The workloads tests' catalogue: cluster "lab" (architecture C), h100, a100-1g.10gb (MIG) and cpu flavors, and
    quotas: acme-vision 8 H100 (+2) and 4 slices, acme-nlp 2 H100, globex-llm 4 H100."""
    return make_catalogue(cast)
