"""The capacity page's node pool table written by one Jinja2 render (templates/jinja2/quotas/_pool_rows.html,
docs/performance.md): byte for byte what the Django loop it replaced wrote, for every kind of pool row (named pools
with and without a GPU product, MIG layout and pool label, markup in names, nodes without a pool, NotReady, vanished
and MIG-pending nodes, offers lost to nodes that do not count, a pool offering no GPU flavor)."""

from __future__ import annotations

import pytest
from django.template import Context, engines

from quotas.models import Node, NodePool

from .factories import GPU, H100_PRODUCT, make_node

pytestmark = [pytest.mark.django_db]

# The page's pool rows as the Django template wrote them before (the reference).
DJANGO_POOL_ROWS = """{% load quota_tags %}{% for p in pools %}
              <tr>
                <td data-label="Pool">
                  <strong>{{ p.pool.name|default:"(no pool)" }}</strong>
                  {% if p.pool %}<br><span class="muted small">{{ p.pool.gpu_product|default:"no GPU" }} · {{ p.pool.get_sharing_display }}{% if p.pool.mig_config %} · {{ p.pool.mig_config }}{% endif %}{% if p.pool.pool_label %} · {{ p.pool.pool_label }}{% endif %}</span>{% endif %}
                </td>
                <td data-label="Nodes">
                  {{ p.counting }} of {{ p.nodes }} count
                  {% if p.notready %}<span class="flag flag-notready">{{ p.notready }} NotReady</span>{% endif %}
                  {% if p.vanished %}<span class="flag flag-vanished">{{ p.vanished }} vanished</span>{% endif %}
                  {% if p.mig %}<span class="flag flag-mig">{{ p.mig }} MIG change pending</span>{% endif %}
                </td>
                <td data-label="Offers">
                  {% for o in p.offers %}<div>{{ o.flavor.name }}: <strong>{{ o.counting|qty }}</strong>{% if o.lost %} <span class="over">/ {{ o.lost|qty }} lost</span>{% endif %}</div>{% empty %}<span class="muted">no GPU flavor matches</span>{% endfor %}
                </td>
                <td data-label="Flavor totals">
                  {% for o in p.offers %}<div>{{ o.flavor.name }}: {{ o.capacity|qty }} · {{ o.promised|qty }} · {{ o.used|qty }}</div>{% endfor %}
                </td>
              </tr>
            {% endfor %}"""



def pool_tbody(body: str) -> str:
    section = body.split('id="pools-h"', 1)[1].split("</table>", 1)[0]
    return section.split("<tbody>\n            ", 1)[1].rsplit("\n          </tbody>", 1)[0]


def test_pool_rows_are_what_the_django_loop_wrote(as_user, split, jinja_renders) -> None:
    cluster = split.cluster
    h100 = NodePool.objects.create(cluster=cluster, name="h100 <pool>", gpu_product=H100_PRODUCT, pool_label="online & up")
    mig = NodePool.objects.create(cluster=cluster, name="mig", gpu_product="NVIDIA-A100", sharing=NodePool.Sharing.MIG,
                                  mig_config="all-1g.10gb")
    bare = NodePool.objects.create(cluster=cluster, name="cpu-only", gpu_product="", sharing=NodePool.Sharing.NONE)
    Node.objects.filter(cluster=cluster, name__startswith="gpu-h100").update(pool=h100)
    Node.objects.filter(cluster=cluster, name="gpu-a100-mig-0").update(pool=mig, mig_config_state="pending")
    Node.objects.filter(cluster=cluster, name="gpu-h100-1").update(present=False)
    Node.objects.create(cluster=cluster, name="cpu-0", pool=bare, labels={}, allocatable={"cpu": "64", "memory": "256Gi"})
    make_node(cluster, "loose-h100", labels={"nvidia.com/gpu.product": H100_PRODUCT}, allocatable={GPU: "4"})

    response = as_user("ops").get(f"/ops/capacity/?cluster={cluster.name}")
    assert response.status_code == 200
    assert jinja_renders == ["quotas/capacity_body.html", "frame.html"]  # the body, pool table included: one render
    pools = response.context["pools"]
    kinds = {(p["pool"].name if p["pool"] else None) for p in pools}
    assert {"h100 <pool>", "mig", "cpu-only", None} <= kinds
    assert any(o["lost"] for p in pools for o in p["offers"]) and any(not p["offers"] for p in pools)
    assert any(p["notready"] for p in pools) and any(p["vanished"] for p in pools) and any(p["mig"] for p in pools)

    expected = engines["django"].from_string(DJANGO_POOL_ROWS).template.render(Context({"pools": pools}))
    body = response.content.decode()
    assert pool_tbody(body) == expected
    assert "h100 &lt;pool&gt;" in body and "online &amp; up" in body and "(no pool)" in body and "no GPU" in body
