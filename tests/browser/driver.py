"""Drive the voice demo page in headless Chromium against a real server; print one JSON object.

Run by tests/browser/test_demo.py inside a network namespace of its own (`unshare -n`, loopback only), so every
packet, WebRTC included, stays on 127.0.0.1. It starts the server itself (the gateway serves web/
at /), launches /usr/bin/chromium with a fake microphone playing `--wav` in a loop, runs one scenario and
writes what the page and /health reported to `--out`.

    python tests/browser/driver.py --scenario ws-opus-turn --wav speech.wav --cache-dir DIR --out-dir DIR

`--url http://127.0.0.1:8000` drives an already running server instead (development).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tests.browser.wire import media_sections, watch_sent, watch_wire  # noqa: E402
from tests.conftest import start_server, stop_server  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required", "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream", "--allow-loopback-in-peer-connection",
]
TURN_TIMEOUT_MS = 120_000
API_KEY = "sekrit"
KEY_STORAGE = "voice-gateway.api-key"  # web/page-options.js

STATS_JS = "() => JSON.parse(JSON.stringify({state: voiceDemo.state, stats: voiceDemo.stats, replies: voiceDemo.replies()}))"


def start_web_server(cache_dir: Path, log_path: Path, *extra: str, model: str) -> tuple[subprocess.Popen, str]:
    # ICE candidates on loopback: aioice skips it unless told
    proc, server = start_server(cache_dir, log_path, "--webrtc-host-address", "127.0.0.1", *extra, model=model)
    return proc, server.base_url


def health(url: str) -> dict:
    return httpx.get(url + "/health", timeout=10).json()


def wait_health(url: str, timeout_s: float) -> tuple[bool, list[dict]]:
    """Poll /health until no session and no engine request is left; every snapshot is returned."""
    snapshots = []
    deadline = time.monotonic() + timeout_s
    while True:
        h = health(url)
        snapshots.append({k: h.get(k) for k in ("active_sessions", "active_requests")})
        if h.get("active_sessions") == 0 and h.get("active_requests") == 0:
            return True, snapshots
        if time.monotonic() > deadline:
            return False, snapshots
        time.sleep(0.25)


def new_page(browser, console: list[str]):
    page = browser.new_page(viewport={"width": 1360, "height": 860})
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    return page


def open_page(browser, url: str, transport: str, console: list[str], options: str = "", watch=None):
    """The demo with `options` more in its query ("&name=value..."); `watch(page)` runs before it loads."""
    page = new_page(browser, console)
    if watch is not None:
        watch(page)
    page.goto(f"{url}/?transport={transport}{options}")
    page.wait_for_function("() => window.voiceDemo && voiceDemo.model !== null", timeout=30_000)
    return page


def connect(page, transport: str) -> str | None:
    """voiceDemo.connect(transport); the error message if it failed."""
    return page.evaluate("""async (t) => {
        try { await voiceDemo.connect(t); return null; } catch (e) { return String(e && e.message || e); }
    }""", transport)


def start_page(browser, url: str, transport: str, result: dict, mode: str = "vad", options: str = "", watch=None,
               video: str = "off"):
    """Open the demo, pick the turn mode and the video source, connect; the page, with console output and any error
    in `result`."""
    result["console"] = console = []
    page = open_page(browser, url, transport, console, options, watch)
    result["random_notice_visible"] = page.is_visible("#random-notice")
    result["model_pill"] = page.inner_text("#model")
    result["video_control"] = page.evaluate("""() => { const s = document.getElementById("camera");
        return {disabled: s.disabled, title: s.title}; }""")
    page.evaluate("(m) => voiceDemo.setMode(m)", mode)
    if video != "off":
        show_video(page, video)
    result["connect_error"] = connect(page, transport)
    return page


def show_video(page, source: str) -> None:
    """Pick `source` ("camera", "screen") in the page's video control, as a user does, and wait for its preview."""
    page.select_option("#camera", source)
    page.wait_for_function("""(s) => voiceDemo.camera.source === s && voiceDemo.camera.live
        && document.getElementById("camera-preview").videoWidth > 0""", arg=source, timeout=30_000)


def wait_for(page, predicate_js: str, result: dict, polling_ms: int) -> None:
    try:
        page.wait_for_function(predicate_js, timeout=TURN_TIMEOUT_MS, polling=polling_ms)
    except Exception as e:  # noqa: BLE001 - reported in the JSON, asserted by the test
        result["wait_error"] = str(e).splitlines()[0]


def close_page(page, out_dir: Path, picture: str, result: dict) -> None:
    result["page"] = page.evaluate(STATS_JS)
    result["transcript_html_turns"] = page.locator("#turns > li").count()
    page.screenshot(path=str(out_dir / picture))
    page.close()


def scenario_turn(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """One spoken turn and its reply, the video off; what the page put on the wire is reported."""
    result["wire"] = wire = []
    page = start_page(browser, url, transport, result, watch=lambda p: watch_wire(p, wire))
    if result["connect_error"] is None:
        audio_seen = "s.packetsReceived > 0" if transport == "webrtc" else "s.audioSamplesPlayed > 0"
        wait_for(page, "() => { const s = voiceDemo.stats; return s.responsesCompleted >= 1"
                 f" && s.lastLatencyMs !== null && {audio_seen}; }}", result, 200)
        page.wait_for_timeout(600)  # let the stats panel catch up before the picture
    result["dom"] = page.evaluate(TRANSCRIPT_JS)
    result["offer_media"] = offer_media(wire)
    close_page(page, out_dir, f"{transport}-turn.png", result)
    result["health_after_close"] = wait_health(url, 15)


def offer_media(wire: list[dict]) -> dict[str, str] | None:
    """The m-sections of the WebRTC offer the page sent (kind -> direction); None if it sent none."""
    offer = next((entry for entry in wire if entry["dir"] == "offer"), None)
    return None if offer is None else media_sections(offer["sdp"])


def scenario_video_turn(browser, url: str, transport: str, out_dir: Path, result: dict, source: str = "camera",
                        mid_call: bool = False) -> None:
    """The video on (`source`, picked before connecting or, with `mid_call`, once connected): a spoken turn whose
    reply's prompt holds a frame, shown as the turn's thumbnail. What the page put on the wire is reported."""
    result["wire"] = wire = []
    page = start_page(browser, url, transport, result, watch=lambda p: watch_wire(p, wire),
                      video="off" if mid_call else source)
    if result["connect_error"] is None:
        if mid_call:
            show_video(page, source)
        wait_for(page, """() => { const s = voiceDemo.stats;
            return s.responses.some((r) => r.status === "completed" && r.imageTokens > 0)
                && [...document.querySelectorAll("#turns > li.user img.frame")].some((img) => img.naturalWidth > 0); }""",
                 result, 200)
        page.wait_for_timeout(600)
    result["dom"] = page.evaluate(TRANSCRIPT_JS)
    result["offer_media"] = offer_media(wire)
    result["preview"] = page.evaluate("""() => { const v = document.getElementById("camera-preview");
        return {hidden: v.hidden, width: v.videoWidth, height: v.videoHeight}; }""")
    close_page(page, out_dir, f"{transport}-{source}.png", result)
    result["health_after_close"] = wait_health(url, 15)


def scenario_close(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """Connect, wait until a reply is being generated, then close the page: the server must free everything."""
    page = start_page(browser, url, transport, result)
    if result["connect_error"] is None:
        result["health_connected"] = health(url)
        wait_for(page, "() => (voiceDemo.stats.eventCounts['response.created'] || 0) >= 1", result, 50)
        result["health_replying"] = health(url)
    close_page(page, out_dir, f"{transport}-close.png", result)
    result["freed"], result["health_after_close"] = wait_health(url, 10)


def scenario_barge_in(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """The fake mic talks again while the reply plays: the page must stop it and truncate the item."""
    page = start_page(browser, url, transport, result)
    if result["connect_error"] is None:
        wait_for(page, "() => voiceDemo.stats.truncationsAcked >= 1", result, 100)
        page.wait_for_timeout(400)
    close_page(page, out_dir, f"{transport}-barge-in.png", result)
    result["health_after_close"] = wait_health(url, 15)


def scenario_push_to_talk(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """Hold the talk button for 3 s of the fake mic, release: a committed turn and a completed reply."""
    page = start_page(browser, url, transport, result, mode="ptt")
    if result["connect_error"] is None:
        page.evaluate("() => voiceDemo.pushToTalk.press()")
        page.wait_for_timeout(3000)
        page.evaluate("() => voiceDemo.pushToTalk.release()")
        wait_for(page, "() => voiceDemo.stats.responsesCompleted >= 1 && voiceDemo.stats.audioSamplesPlayed > 0",
                 result, 200)
    close_page(page, out_dir, f"{transport}-push-to-talk.png", result)
    result["health_after_close"] = wait_health(url, 15)


TRANSCRIPT_JS = """() => ({
    lamp: {...document.getElementById("lamp").dataset, label: document.querySelector("#lamp .state").textContent},
    calls: [...document.querySelectorAll("#turns > li.call")].map((li) => ({...li.dataset, text: li.innerText})),
    users: [...document.querySelectorAll("#turns > li.user")].map((li) => {
        const img = li.querySelector("img.frame");
        return {transcription: li.dataset.transcription ?? null, text: li.querySelector(".text").textContent,
                meta: li.querySelector(".meta").textContent,
                frame: img && {width: img.naturalWidth, height: img.naturalHeight, src: img.src.split(",")[0]}};
    }),
})"""


def scenario_tool_call(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """`?tool_choice=set_lamp`: a spoken turn makes the model call the page's lamp; the page runs it, sends its
    output and asks for the answer, which must be words. Every event the page sent is reported."""
    sent: list[dict] = []
    result["sent"] = sent
    page = start_page(browser, url, transport, result, options="&tool_choice=set_lamp",
                      watch=lambda p: watch_sent(p, sent))
    if result["connect_error"] is None:
        # a response after the one that called: the answer
        wait_for(page, """() => { const o = voiceDemo.stats.responseOutputs;
            const i = o.findIndex((types) => types.includes("function_call")); return i >= 0 && o.length > i + 1; }""",
                 result, 200)
        page.wait_for_timeout(300)
    result["dom"] = page.evaluate(TRANSCRIPT_JS)
    close_page(page, out_dir, f"{transport}-tool-call.png", result)
    result["health_after_close"] = wait_health(url, 15)


def scenario_transcription(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """`?transcribe=1`: a spoken turn is transcribed and its words become the user's line in the transcript."""
    page = start_page(browser, url, transport, result, options="&transcribe=1")
    if result["connect_error"] is None:
        wait_for(page, """() => { const s = voiceDemo.stats; return s.responsesCompleted >= 1
            && (Object.keys(s.transcripts).length >= 1
                || (s.eventCounts["conversation.item.input_audio_transcription.failed"] || 0) >= 1); }""", result, 200)
        page.wait_for_timeout(300)
    result["dom"] = page.evaluate(TRANSCRIPT_JS)
    close_page(page, out_dir, f"{transport}-transcription.png", result)
    result["health_after_close"] = wait_health(url, 15)


def connect_session(page, transport: str) -> dict:
    """Connect, wait for the server's session.created, disconnect: the connect error and the session id."""
    error = connect(page, transport)
    if error is None:
        page.wait_for_function("() => voiceDemo.stats.sessionId !== null", timeout=30_000)
    session = {"connect_error": error, "session_id": page.evaluate("() => voiceDemo.stats.sessionId")}
    page.evaluate("() => voiceDemo.disconnect()")
    return session


def load(page, address: str | None) -> dict:
    """Go to `address` (None: reload) and wait until the model info loaded or the page shows an error."""
    page.reload() if address is None else page.goto(address)
    page.wait_for_function("() => window.voiceDemo && (voiceDemo.model !== null || voiceDemo.stats.errors.length > 0)",
                           timeout=30_000)
    return page.evaluate("() => ({href: location.href, model: voiceDemo.model?.id ?? null, errors: voiceDemo.stats.errors})")


def scenario_key_in_url(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """On a keyed server, open `/?key=`: the key must leave the address bar, live in sessionStorage and work,
    after a reload too; a tab without it is refused."""
    result["console"] = console = []
    result["key"] = API_KEY
    page = new_page(browser, console)
    loaded = result["loaded"] = load(page, f"{url}/?key={API_KEY}&transport={transport}")
    loaded["stored_key"] = page.evaluate(f"() => sessionStorage.getItem('{KEY_STORAGE}')")
    loaded.update(connect_session(page, transport))
    reloaded = result["reloaded"] = load(page, None)
    reloaded.update(connect_session(page, transport))
    page.close()
    page = new_page(browser, console)  # a context of its own: an empty sessionStorage
    result["keyless"] = load(page, f"{url}/?transport={transport}")
    page.close()


def scenario_server_elsewhere(browser, url: str, transport: str, out_dir: Path, result: dict) -> None:
    """Open `/?server=` naming another origin (nothing listens there) twice: the confirm dismissed, then accepted.
    Every HTTP request and WebSocket each page made is reported."""
    result["console"] = console = []
    # the server's own port on another loopback address: another origin, and the server listens on 127.0.0.1 only
    result["elsewhere"] = elsewhere = url.replace("127.0.0.1", "127.0.0.2")
    for accept in (False, True):
        seen = result["accepted" if accept else "dismissed"] = {"dialogs": [], "requests": [], "websockets": []}

        def answer(dialog, seen=seen, accept=accept) -> None:
            seen["dialogs"].append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        page = new_page(browser, console)
        page.on("dialog", answer)
        page.on("request", lambda r, seen=seen: seen["requests"].append(r.url))
        page.on("websocket", lambda ws, seen=seen: seen["websockets"].append(ws.url))
        seen.update(load(page, f"{url}/?server={elsewhere}&transport={transport}"))
        if not accept:
            seen.update(connect_session(page, transport))
        page.close()


SCENARIOS = {
    "ws-opus-push-to-talk": (scenario_push_to_talk, "ws-opus"),
    "ws-opus-turn": (scenario_turn, "ws-opus"),
    "ws-pcm16-turn": (scenario_turn, "ws-pcm16"),
    "webrtc-turn": (scenario_turn, "webrtc"),
    "ws-opus-camera": (scenario_video_turn, "ws-opus"),
    "webrtc-camera": (scenario_video_turn, "webrtc"),
    "webrtc-screen-mid-call": (partial(scenario_video_turn, source="screen", mid_call=True), "webrtc"),
    "ws-opus-close": (scenario_close, "ws-opus"),
    "webrtc-close": (scenario_close, "webrtc"),
    "ws-pcm16-barge-in": (scenario_barge_in, "ws-pcm16"),
    "ws-opus-barge-in": (scenario_barge_in, "ws-opus"),
    "webrtc-barge-in": (scenario_barge_in, "webrtc"),
    "ws-opus-tool-call": (scenario_tool_call, "ws-opus"),
    "webrtc-transcription": (scenario_transcription, "webrtc"),
    "key-in-url": (scenario_key_in_url, "ws-opus"),
    "server-elsewhere": (scenario_server_elsewhere, "ws-opus"),
}
SERVER_ARGS = {"key-in-url": ("--api-key", API_KEY)}  # a scenario's extra `serve` arguments


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), required=True)
    parser.add_argument("--wav", type=Path, required=True, help="the fake microphone: 16-bit PCM WAV")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="the JSON result (default: OUT_DIR/result.json)")
    parser.add_argument("--cache-dir", type=Path, help="the tiny checkpoint's cache dir (to start a server)")
    parser.add_argument("--url", help="drive this running server instead of starting one")
    parser.add_argument("--model", default="tiny", help="the model the started server serves")
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out or args.out_dir / "result.json"
    result: dict = {"scenario": args.scenario}
    proc = None
    try:
        from playwright.sync_api import sync_playwright

        if args.url:
            url = args.url
        else:
            proc, url = start_web_server(args.cache_dir, args.out_dir / "server.log",
                                         *SERVER_ARGS.get(args.scenario, ()), model=args.model)
        result["url"] = url
        fn, transport = SCENARIOS[args.scenario]
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=CHROMIUM, headless=True,
                args=[*CHROMIUM_FLAGS, f"--use-file-for-fake-audio-capture={args.wav.resolve()}"],
            )
            try:
                fn(browser, url, transport, args.out_dir, result)
            finally:
                browser.close()
    except Exception:  # noqa: BLE001 - the test prints it
        result["driver_error"] = traceback.format_exc()
    finally:
        if proc is not None:
            stop_server(proc)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k != "console"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
