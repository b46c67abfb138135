"""Demo billing data: a price list for the demo's flavors and a small monthly budget on acme-vision, low enough
that the demo's running work crosses its alert thresholds within minutes of ``make run`` (the sandbox runs at
60×: a minute is an hour of GPU time). Idempotent."""

from __future__ import annotations

import logging
from datetime import timedelta
from decimal import Decimal

from quotas.models import Flavor
from tenants.access import Actor
from tenants.models import Project

from . import costs, services
from .budgets import budget_create
from .models import Budget, Price, Unit

logger = logging.getLogger(__name__)

GPU_PRICES = {"h100-80gb": Decimal("2.50"), "a100-80gb": Decimal("1.60"), "l40s": Decimal("0.90")}
MIG_PRICE = Decimal("0.35")
FLAT = {Unit.CPU: Decimal("0.04"), Unit.MEMORY: Decimal("0.005"), Unit.HAMI_MEMORY: Decimal("0.02"),
        Unit.HAMI_CORES: Decimal("0.50"), Unit.STORAGE: Decimal("0.10")}
DEMO_BUDGET = Decimal("5.00")  # two simulated GPU-hours of H100: minutes of the demo


def seed_billing_demo() -> None:
    system = Actor(user=None)
    if not Price.objects.exists():
        # From the start of last month: the demo's seeded history (insights/demo.py, three weeks back) is priced too.
        start = costs.month_start(costs.month_start() - timedelta(days=1))
        for model in sorted(set(Flavor.objects.filter(kind="whole").values_list("gpu_model", flat=True)) - {""}):
            services.price_create(actor=system, unit=Unit.GPU, key=model, amount=GPU_PRICES.get(model, Decimal("1.00")),
                                  effective_from=start, note="demo")
        for profile in sorted(set(Flavor.objects.filter(kind="mig").values_list("mig_profile", flat=True)) - {""}):
            services.price_create(actor=system, unit=Unit.MIG, key=profile, amount=MIG_PRICE, effective_from=start, note="demo")
        for unit, amount in FLAT.items():
            services.price_create(actor=system, unit=unit, amount=amount, effective_from=start, note="demo")
    project = Project.objects.select_related("tenant").filter(slug="acme-vision").first()
    if project is None:
        logger.warning("billing demo: no acme-vision project, no budget")
        return
    if not Budget.objects.filter(project=project).exists():
        budget_create(actor=system, tenant=project.tenant, project=project, amount=DEMO_BUDGET)
