"""A server installed without the `[webrtc]` extra: it starts, serves the WebSocket, and answers
POST /v1/realtime/calls with OpenAI's error shape naming the extra. aiortc is made unimportable in a
process of its own, as on a machine where it was never installed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SERVER_WITHOUT_AIORTC = """
import json, sys
from pathlib import Path
sys.modules["aiortc"] = None  # `import aiortc` now raises ImportError, as where it is not installed
from starlette.testclient import TestClient
from engine import create_engine, load_profile
from voice_gateway.app import create_app
from voice_gateway.config import GatewayConfig

app = create_app(create_engine("tiny", load_profile(model="tiny", platform="cpu"), Path(sys.argv[1])),
                 GatewayConfig(allowed_hosts=("testserver",)))
with TestClient(app) as client:
    call = client.post("/v1/realtime/calls", content="v=0\\r\\nm=audio 9 UDP/TLS/RTP/SAVPF 111\\r\\n",
                       headers={"content-type": "application/sdp"})
    with client.websocket_connect("/v1/realtime") as ws:
        created = ws.receive_json()["type"]
    active = client.get("/health").json()["active_sessions"]
loaded = sorted(m for m in sys.modules if m.startswith(("aiortc", "voice_gateway.webrtc.call")) and sys.modules[m])
print(json.dumps({"status": call.status_code, "body": call.json(), "created": created, "active": active,
                  "loaded": loaded}))
"""


def test_without_aiortc_the_server_starts_and_the_calls_route_names_the_extra(tiny_checkpoint: Path,
                                                                            cache_dir: Path) -> None:
    run = subprocess.run([sys.executable, "-c", SERVER_WITHOUT_AIORTC, str(cache_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["status"] == 501, seen
    error = seen["body"]["error"]
    assert error["code"] == "webrtc_not_installed" and error["type"] == "server_error", error
    assert "voice-gateway[webrtc]" in error["message"] and "/v1/realtime" in error["message"], error
    # the WebSocket serves, the refused call left no session, and nothing of aiortc came in
    assert seen["created"] == "session.created" and seen["active"] == 0 and seen["loaded"] == [], seen
