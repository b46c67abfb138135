"""Screenshots of a running portal (a script, not a test): log in as the demo users and capture the pages the release
notes show, with how long each page took to load.

    python tests/bench/screens.py [--url http://127.0.0.1:8000] [--out docs/screenshots]

Needs `make run` (the demo data; password ``portal-demo``) and Debian's Chromium. Prints one line per page: its
file, the user, the address and the load time (navigation start to the load event, as the browser measured it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
PAGES = [
    # (file, user, path, what to wait for)
    ("hami-share-form.png", "carol", "/requests/new/?template=training", "main form"),
    ("budgets.png", "alice", "/tenants/acme/budgets/", "main"),
    ("ops-overview.png", "ops", "/ops/metrics/", "main"),
    ("tenant-overview.png", "alice", "/tenants/acme/metrics/", "main"),
    ("capacity-kueue-api.png", "ops", "/ops/capacity/", "#kueue-api"),
    ("requests.png", "carol", "/requests/", "main"),
    ("zones.png", "ops", "/ops/zones/", "main"),
    ("gpu-health.png", "ops", "/ops/health/", "main"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--out", default="docs/screenshots")
    parser.add_argument("--page", action="append", default=[], metavar="FILE=USER:PATH",
                        help="another page to capture, e.g. preemption.png=carol:/requests/12/")
    parser.add_argument("--only", action="store_true", help="only the pages given with --page")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    pages = [] if args.only else list(PAGES)
    for extra in args.page:
        name, rest = extra.split("=", 1)
        user, path = rest.split(":", 1)
        pages.append((name, user, path, "main"))
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"])
        contexts: dict[str, object] = {}
        for name, user, path, wait_for in pages:
            if user not in contexts:
                ctx = browser.new_context(viewport={"width": 1280, "height": 900})
                page = ctx.new_page()
                page.goto(f"{args.url}/accounts/login/")
                page.fill("input[name=username]", user)
                page.fill("input[name=password]", "portal-demo")
                page.click("button[type=submit]")
                page.wait_for_load_state("networkidle")
                contexts[user] = ctx
            page = contexts[user].new_page()
            response = page.goto(f"{args.url}{path}")
            page.wait_for_selector(wait_for, state="attached", timeout=30000)
            if name.startswith("hami"):
                # The HAMi flavor chosen, so the form shows the share size and its cost.
                flavor = page.locator("select[name=flavor]")
                label = next(o for o in flavor.locator("option").all_inner_texts() if "HAMi" in o)
                flavor.select_option(label=label)
                page.wait_for_load_state("networkidle")
            took = page.evaluate("(() => { const t = performance.getEntriesByType('navigation')[0];"
                                 " return t ? Math.round(t.loadEventEnd - t.startTime) : -1; })()")
            page.screenshot(path=str(out / name), full_page=True)
            print(f"{name}: {user} {path} -> {response.status if response else '?'} in {took} ms", flush=True)
            page.close()
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
