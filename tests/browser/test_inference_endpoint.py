"""An inference service in a real browser, against a real sandbox cluster and a real Celery worker (docs/inference.md).

The researcher opens her running service's endpoint page from the request page, makes a key (shown once), and a
client calls the service through its route in the portal with that key (200, an OpenAI-style completion) and
without it (401, also with her browser's session); the page charts the replica count over time.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.workloads.test_lifecycle import World, _world, celery_worker_thread, worker  # noqa: F401 - fixtures
from workloads.models import InferenceKey, ReplicaSample, RequestState

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.xdist_group("lifecycle"),
              pytest.mark.timeout(300)]
S = RequestState


@pytest.fixture
def world(fresh_sandbox, cast, worker) -> World:  # noqa: F811 - the fixture named like the imported helper
    return _world(fresh_sandbox, cast, architecture="B")


def test_researcher_makes_a_key_and_a_client_calls_her_service_with_it(world: World, signed_in) -> None:
    svc = world.submit("carol", "inference", "h100-80gb-offline", gpus=1, duration_hours=4, replicas=2,
                       parameters={"model_uri": "hf://demo/tiny-chat", "min_replicas": 1})
    assert svc.state == S.PENDING_APPROVAL  # the online class always waits for an approver
    svc = world.approve(svc)
    svc = world.wait(svc, lambda r: r.state == S.RUNNING, advance=5)
    assert ReplicaSample.objects.filter(request=svc).exists()

    page = signed_in("carol")
    page.goto(f"/requests/{svc.pk}/")
    page.get_by_role("link", name="Endpoint and keys").click()
    page.wait_for_url(f"**/requests/{svc.pk}/endpoint/")
    expect(page.locator("#proxy-address")).to_contain_text(f"/inference/{svc.pk}/")
    expect(page.get_by_text("1 to 2, on the request rate")).to_be_visible()
    expect(page.locator("pre")).to_contain_text('"model": "demo/tiny-chat"')
    expect(page.locator("#replica-chart-canvas")).to_have_attribute("data-rendered", "true")

    page.get_by_label("Name of a new key").fill("my laptop")
    page.get_by_role("button", name="Make a key").click()
    key = page.locator("#new-key code").inner_text().strip()
    assert key.startswith("gpk-")
    expect(page.get_by_role("cell", name="my laptop", exact=True)).to_be_visible()

    body = {"model": "demo/tiny-chat", "prompt": "Hello", "max_tokens": 8}
    url = f"/inference/{svc.pk}/v1/completions"
    called = page.request.post(url, data=body, headers={"Authorization": f"Bearer {key}"})
    assert called.status == 200, called.text()
    answer = called.json()
    assert answer["object"] == "text_completion" and answer["model"] == "demo/tiny-chat"
    assert len(answer["choices"][0]["text"].split()) == 8
    refused = page.request.post(url, data=body)  # her browser's session cookie is no key
    assert refused.status == 401 and refused.json()["error"]["type"] == "invalid_api_key"
    wrong = page.request.post(url, data=body, headers={"Authorization": "Bearer gpk-not-a-key"})
    assert wrong.status == 401

    page.reload()  # the key is shown once, and a reload makes no second key (the POST redirected)
    expect(page.locator("#new-key")).to_have_count(0)
    assert InferenceKey.objects.filter(request=svc).count() == 1
    assert key not in page.content()
    expect(page.locator("#replica-chart-canvas")).to_have_attribute("data-rendered", "true")
    drawn = page.evaluate("""() => {
        const c = Chart.getChart(document.getElementById('replica-chart-canvas'));
        return c.data.datasets.map(d => d.label);
    }""")
    assert drawn == ["Replicas", "Ready"]
