"""The demo page's trust-carrying URL options (web/page-options.js) in headless Chromium against a real server.

`?key=` must leave the address bar at once and live on in this tab's sessionStorage; a `?server=` of another
origin must be confirmed before the page talks to it. Each test runs one driver.py scenario, as test_demo.py does.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.browser.harness import explain, run_driver, unavailable_reason

_reason = unavailable_reason()
if _reason is not None:
    pytest.skip(_reason, allow_module_level=True)


def test_a_key_in_the_url_moves_to_session_storage(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                                   tmp_path: Path) -> None:
    result = run_driver("key-in-url", fake_mic_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    key = result["key"]
    loaded, reloaded = result["loaded"], result["reloaded"]
    assert key not in loaded["href"] and "key=" not in loaded["href"], why
    assert loaded["stored_key"] == key, why
    # /v1/models and the realtime WebSocket both want the key on this server
    assert loaded["model"] and loaded["connect_error"] is None and loaded["session_id"], why
    assert "key=" not in reloaded["href"], why
    assert reloaded["model"] and reloaded["connect_error"] is None and reloaded["session_id"], why
    # the control: a tab without the key is refused, so the two above did send it
    assert result["keyless"]["model"] is None and any("401" in e for e in result["keyless"]["errors"]), why
    # Only the first page load's request line carries the key; the reload's does not.
    log_lines = [line for line in (tmp_path / "server.log").read_text().splitlines() if key in line]
    assert len(log_lines) == 1 and f"GET /?key={key}&" in log_lines[0], log_lines


def test_another_server_in_the_url_is_confirmed_first(tiny_checkpoint: Path, cache_dir: Path, fake_mic_wav: Path,
                                                      tmp_path: Path) -> None:
    result = run_driver("server-elsewhere", fake_mic_wav, cache_dir, tmp_path)
    why = explain(result, tmp_path)
    own, elsewhere = urlsplit(result["url"]).netloc, urlsplit(result["elsewhere"]).netloc
    dismissed, accepted = result["dismissed"], result["accepted"]
    for seen in (dismissed, accepted):
        assert len(seen["dialogs"]) == 1 and result["elsewhere"] in seen["dialogs"][0], (seen["dialogs"], why)

    # dismissed: the page's own origin, for HTTP and the session's WebSocket, and nothing sent elsewhere
    assert {urlsplit(u).netloc for u in dismissed["requests"] + dismissed["websockets"]} == {own}, (dismissed, why)
    assert dismissed["model"] and dismissed["connect_error"] is None and dismissed["session_id"], why
    assert dismissed["websockets"], why

    # accepted: the page asks the other origin (where nothing listens) for its model
    asked = [u for u in accepted["requests"] if urlsplit(u).netloc == elsewhere]
    assert any(urlsplit(u).path == "/v1/models" for u in asked), (accepted, why)
    assert accepted["model"] is None and any("cannot reach the server" in e for e in accepted["errors"]), why
