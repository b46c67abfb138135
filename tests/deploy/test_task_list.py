"""docs/operations.md lists every Celery task with why running it twice is safe: the table and the registered
tasks are the same set."""

from __future__ import annotations

import re
from pathlib import Path

from portal.celery import app

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_every_task_is_in_the_table_and_nothing_else():
    text = DOC.read_text()
    table = text[text.index("### Tasks (each safe to run twice)"):text.index("## Backups and restore")]
    listed = {name for row in table.splitlines() if row.startswith("| `")
              for name in re.findall(r"`([\w.]+)`", row.split("|")[1])}
    app.loader.import_default_modules()
    registered = {name for name in app.tasks if not name.startswith("celery.")}
    assert listed == registered, {"not in the table": registered - listed, "not a task": listed - registered}
