"""Phone calls behind `serve --http-workers 2`: the kernel hands each connection to either worker, so a call's
sideband and its hang-up are sent here to the worker that does not hold the call, on that worker's own socket in
the folder the workers share (the log names it), and must reach the call all the same."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import unix_connect

from bench.phone_carrier import CarrierCall, answer_stream, ring
from tests.conftest import Server, stop_server
from tests.integration.test_phone import (  # noqa: F401 (fixtures, this module's own instances)
    API_KEY,
    AUTH_TOKEN,
    App,
    Recorder,
    app,
    start_phone_server,
    twilio_api,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def two_workers(tiny_checkpoint: Path, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                app: App, twilio_api: Recorder) -> Iterator[tuple[Server, Path]]:  # noqa: F811
    proc, server = start_phone_server(cache_dir, tmp_path_factory.mktemp("phone-workers") / "server.log", app,
                                      twilio_api, "--http-workers", "2")
    match = re.search(r"share their phone calls in (\S+)", server.log())
    assert match, server.log()
    folder = Path(match[1])
    deadline = time.monotonic() + 30
    while len(list(folder.glob("*.sock"))) < 2:  # each worker's socket opens with its app
        assert time.monotonic() < deadline, list(folder.iterdir())
        time.sleep(0.1)
    yield server, folder
    stop_server(proc)
    assert "Traceback" not in server.log()


async def _holder(folder: Path, call_id: str) -> Path:
    path = folder / "calls" / hashlib.sha256(call_id.encode()).hexdigest()
    deadline = time.monotonic() + 10
    while not path.exists():  # the call is held once its stream's start is read
        assert time.monotonic() < deadline, "the call never went live"
        await asyncio.sleep(0.05)
    return Path(json.loads(path.read_text())["socket"])


async def test_a_call_is_reached_from_the_worker_that_does_not_hold_it(
        two_workers: tuple[Server, Path], twilio_api: Recorder) -> None:  # noqa: F811
    server, folder = two_workers
    keyed = {"authorization": f"Bearer {API_KEY}"}
    reply, call_id = await ring(server.base_url, "twilio", auth_token=AUTH_TOKEN)  # the app accepts it
    assert reply.status_code == 200, reply.text
    url, params = answer_stream(reply.text)
    async with CarrierCall("twilio", url, params, call_id) as call:
        holder = await _holder(folder, call_id)
        [other] = [s for s in folder.glob("*.sock") if s != holder]
        query = urllib.parse.urlencode({"call_id": call_id})
        async with unix_connect(str(other), f"ws://127.0.0.1/v1/realtime?{query}", additional_headers=keyed,
                                subprotocols=["realtime"]) as band:  # type: ignore[list-item]
            await call.dtmf("7")
            deadline = time.monotonic() + 10
            while (event := json.loads(await asyncio.wait_for(band.recv(), 10)))["type"] != (
                    "input_audio_buffer.dtmf_event_received"):
                assert time.monotonic() < deadline
            assert event["event"] == "7", event
            async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(other)),
                                         base_url="http://127.0.0.1") as to_other:
                # no key: refused where it arrives
                refused = await to_other.post(f"/v1/realtime/calls/{call_id}/hangup")
                hung_up = await to_other.post(f"/v1/realtime/calls/{call_id}/hangup", headers=keyed)
            await asyncio.wait_for(call.closed.wait(), 30)
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_request_error", refused.text
    assert hung_up.status_code == 200, hung_up.text
    assert call.close_code == 1000
    assert [r for r in twilio_api.requests if call_id in r[1]], "no hang-up through Twilio's REST API"
    assert not list((folder / "calls").iterdir()) and not list((folder / "tokens").iterdir())
