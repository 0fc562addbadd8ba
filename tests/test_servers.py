"""tests/servers.py starts servers that a person may look at (scripts/screenshot_ui.py)."""

from __future__ import annotations

import json
import urllib.request


def test_prefect_ui_is_told_the_api_on_its_own_port(prefect_server: str):
    """The session's server runs on a free port, never 4200: its UI must look for the API there
    (Prefect's default hands the browser :4200 whatever --port says)."""
    base = prefect_server.removesuffix("/api")
    assert not base.endswith(":4200")
    with urllib.request.urlopen(f"{base}/ui-settings", timeout=10) as resp:
        assert json.loads(resp.read())["api_url"] == prefect_server
