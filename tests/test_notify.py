"""The portal's notifier (``portal/notify.py``): one email per recipient, the optional JSON webhook, and
failures logged, never raised. The apps' own notification tests (quota requests, request decisions,
idle notices) check what they say and to whom."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.core.mail.backends.base import BaseEmailBackend

from portal.notify import notify_send, webhook_post


class BrokenMailBackend(BaseEmailBackend):
    """A mail server that refuses everything (Django's mail settings point here in one test)."""

    def send_messages(self, email_messages) -> int:
        raise ConnectionRefusedError("mail server down")


class _Hook(BaseHTTPRequestHandler):
    received: list = []
    status = 204

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.headers["Content-Type"], json.loads(body)))
        self.send_response(type(self).status)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def webhook(settings):
    """A real HTTP server on loopback standing in for the customer's webhook."""
    _Hook.received, _Hook.status = [], 204
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.PORTAL_WEBHOOK_URL = f"http://127.0.0.1:{server.server_address[1]}/hooks/portal"
    yield _Hook
    server.shutdown()
    server.server_close()


def test_one_message_per_recipient_then_the_webhook(mailoutbox, webhook) -> None:
    sent = notify_send(subject="[GPU portal] hello", body="Body.\n", to=["a@example.com", "b@example.com", ""],
                       payload={"event": "test.hello", "n": 1})
    assert sent is True
    assert [m.to for m in mailoutbox] == [["a@example.com"], ["b@example.com"]]
    assert all(m.subject == "[GPU portal] hello" and m.body == "Body.\n" for m in mailoutbox)
    assert webhook.received == [("application/json", {"event": "test.hello", "n": 1})]


def test_no_payload_no_webhook_and_nobody_to_email_is_fine(mailoutbox, webhook) -> None:
    assert notify_send(subject="s", body="b", to=[]) is True
    assert mailoutbox == [] and webhook.received == []


def test_a_broken_mail_server_is_logged_and_the_webhook_still_goes(settings, webhook, caplog) -> None:
    settings.EMAIL_BACKEND = "tests.test_notify.BrokenMailBackend"
    sent = notify_send(subject="[GPU portal] x", body="b", to=["a@example.com"], payload={"event": "x"}, topic="quota")
    assert sent is False
    assert "quota notification email failed: [GPU portal] x" in caplog.text and "mail server down" in caplog.text
    assert webhook.received == [("application/json", {"event": "x"})]


def test_webhook_answers(settings, webhook, caplog) -> None:
    assert webhook_post({"event": "ok"}) is True
    webhook.status = 500
    assert webhook_post({"event": "refused"}, topic="request") is False
    assert "request webhook to 127.0.0.1" in caplog.text
    settings.PORTAL_WEBHOOK_URL = "http://127.0.0.1:9/nothing-listens-here"
    assert webhook_post({"event": "nobody"}) is False
    settings.PORTAL_WEBHOOK_URL = "file:///etc/passwd"
    assert webhook_post({"event": "never"}) is False
    assert "must be an http(s) URL" in caplog.text
    settings.PORTAL_WEBHOOK_URL = ""
    assert webhook_post({"event": "off"}) is False
    assert [payload["event"] for _, payload in webhook.received] == ["ok", "refused"]
