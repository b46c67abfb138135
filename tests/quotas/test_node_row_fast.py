"""The capacity page writes its node rows in Python (``{% node_row %}``, docs/performance.md): the same HTML as the
template it replaced, for nodes with and without flags, a pool or a time seen, and markup or numbers among their
allocatable resources."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

from django.template import engines

from quotas.models import Node, NodePool

FAST = "{% load quota_tags %}{% for node, flags, allocatable in rows %}{% node_row node flags allocatable %}{% endfor %}"
TEMPLATE = """{% for node, flags, allocatable in rows %}<tr{% if flags %} class="row-flagged"{% endif %}>
                <td data-label="Node"><code>{{ node.name }}</code></td>
                <td data-label="Pool">{{ node.pool.name|default:"—" }}</td>
                <td data-label="State">{% for css, text in flags %}<span class="flag flag-{{ css }}">{{ text }}</span> {% empty %}<span class="badge badge-active">Counting</span>{% endfor %}</td>
                <td data-label="Allocatable" class="small">{% for key, value in allocatable %}<span class="kv"><code>{{ key }}</code> {{ value }}</span> {% endfor %}</td>
                <td data-label="Last seen">{{ node.last_seen_at|date:"Y-m-d H:i"|default:"—" }}</td>
              </tr>{% endfor %}"""


def test_the_rows_are_the_templates() -> None:
    pool = NodePool(name="a100 <pool> & co")
    rows = [
        (Node(name="gpu-1", pool=pool, last_seen_at=datetime(2026, 11, 30, 20, 57, 3, tzinfo=timezone.utc)), [],
         [("nvidia.com/gpu", "8"), ("cpu", Decimal("95.5")), ("memory", 1234567), ("x<y>", 'a "b" & c')]),
        (Node(name="gpu-2", pool=None, last_seen_at=None), [("notready", "NotReady"), ("mig", "MIG <pending>")], []),
        (Node(name="gpu-3", pool=NodePool(name=""), last_seen_at=None), [("vanished", "vanished")],
         [("cpu", 1.5), ("big", Decimal("1E+3"))]),
    ]
    engine = engines["django"]
    fast = engine.from_string(FAST).render({"rows": rows})
    template = engine.from_string(TEMPLATE).render({"rows": rows})
    assert "&lt;pool&gt;" in fast and "Counting" in fast and "—" in fast
    assert fast == template
