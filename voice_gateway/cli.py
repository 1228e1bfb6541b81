"""`voice-gateway serve [MODEL]` and `voice-gateway bench`; the engine's probes (`accuracy`, `kernels`, `steps`)
are voice_gateway/probe_cli.py's."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voice_gateway import probe_cli

# the engine (torch, transformers) is imported where a server or a probe starts: the bench's client processes are
# spawned, and each imports this module again as its main
if TYPE_CHECKING:
    import threading

    from engine import DeployProfile
    from engine.deploy import EngineHost
    from voice_gateway.config import GatewayConfig
    from voice_gateway.phone import PhoneConfig
    from voice_gateway.webrtc import WebRTCConfig

log = logging.getLogger("voice_gateway")


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default=None,
        help="'assistant' (the default, or with --deploy-config the file's `model:`: small real models on the CPU "
        "that hear, answer and speak; docs/deployment.md), 'tiny' (Qwen3-Omni's architecture with random weights, for tests), a local "
        "Qwen3-Omni checkpoint directory, or a Hugging Face id already in the local cache (nothing is downloaded)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--deploy-config", type=Path, help="deploy profile YAML (default: picked from the model)")
    parser.add_argument("--stage-overrides", help='JSON merged into the profile\'s stages, e.g. \'{"talker": {"max_batch": 8}}\'')
    parser.add_argument("--overrides", help="JSON merged onto the whole profile after its platform delta, e.g. "
                        '\'{"cuda_graphs": false, "stages": {"talker": {"max_batch": 8}}}\'')
    parser.add_argument("--cache-dir", type=Path, help="where the tiny checkpoint is built (default ~/.cache/voice-gateway)")
    parser.add_argument("--api-key", help="require this key (Authorization: Bearer, or the "
                        "openai-insecure-api-key.<key> WebSocket subprotocol); default: the "
                        "VOICE_GATEWAY_API_KEY environment variable, else no key")
    parser.add_argument("--allowed-origins", type=_comma_list, default=(), metavar="ORIGINS",
                        help="comma list of web origins (scheme://host[:port], or *) whose pages may open realtime "
                        "sessions, besides this server's own origin; clients that send no Origin are let in")
    parser.add_argument("--allowed-hosts", type=_comma_list, default=(), metavar="HOSTS",
                        help="comma list of Host names (or *) realtime sessions may come through, besides loopback "
                        "and --host; a name behind a proxy goes here")
    parser.add_argument("--public-metrics", action="store_true", help="serve /metrics without the API key")
    parser.add_argument("--shutdown-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="after SIGTERM, connections still open this long are cut (default 10)")
    parser.add_argument("--header-timeout", type=float, default=15.0, metavar="SECONDS",
                        help="a connection that has not sent a whole request head this long after it opened, or "
                        "after its last response, is closed (default 15)")
    parser.add_argument("--body-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="a connection whose request body pauses this long is closed (default 30)")
    parser.add_argument("--max-sessions", type=int, default=64, help="concurrent realtime sessions")
    parser.add_argument("--max-session-seconds", type=float, default=1800.0)
    parser.add_argument("--max-stored-audio-seconds", type=float, default=600.0,
                        help="committed audio one realtime session keeps for its prompts (64 KB per second; "
                        "default 600, about what an 8192-token context holds)")
    parser.add_argument("--image-fetch-hosts", type=_comma_list, default=(), metavar="HOSTS",
                        help="comma list of host names whose http(s) image URLs the server may fetch (default: "
                        "none; images then come as data URLs)")
    parser.add_argument("--max-image-bytes", type=int, default=10 * 1024 * 1024, metavar="BYTES",
                        help="one input image, encoded (default 10 MiB); a realtime message holds at most "
                        "about 15 MiB of them")
    parser.add_argument("--max-image-pixels", type=int, default=4096 * 4096, metavar="PIXELS",
                        help="one input image's width x height, read from its header before decoding "
                        "(default 4096 x 4096)")
    parser.add_argument("--opus-bitrate", type=int, default=96_000, help="bits/s of Opus output (our extension)")
    parser.add_argument("--webrtc-host-address", action="append", default=[], metavar="IP",
                        help="offer WebRTC ICE candidates on this address only (repeatable; "
                        "default: every interface but loopback)")
    parser.add_argument("--log-level", default="info")
    # uvicorn's own choices; "auto" takes uvloop and httptools (installed with us) over asyncio and h11,
    # which cost the server's one event loop less Python per request and per event
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default="auto", help="event loop")
    parser.add_argument("--http", choices=("auto", "h11", "httptools"), default="auto", help="HTTP/1.1 parser")
    parser.add_argument("--http-workers", type=int,
                        help="server processes in front of one engine process (default: the profile's "
                        "engine.http_workers, else 1; more than 1 runs the engine in its own process, or shares the profile's replicas "
                        "among them; /metrics then sums every "
                        "process's gateway figures, and --max-sessions is per process)")


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _served_hosts(bind_host: str) -> tuple[str, ...]:
    # a wildcard bind address is no name a client reaches us by (and browsers route 0.0.0.0 to loopback)
    return () if bind_host in ("", "0.0.0.0", "::") else (bind_host,)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from engine import EngineError, ProfileError, create_engine, load_profile
    from voice_gateway.app import create_app
    from voice_gateway.config import GatewayConfig
    from voice_gateway.media.images import ImageLimits
    from voice_gateway.read_deadline import ReadTimeouts, http_protocol
    from voice_gateway.webrtc import WebRTCConfig

    try:
        profile = load_profile(args.deploy_config, model=args.model or "assistant", stage_overrides=args.stage_overrides,
                               overrides=args.overrides)
    except ProfileError as e:
        log.error("bad deploy profile: %s", e)
        return 2
    log.info("deploy profile %s: %s", profile.name, profile)
    # no model named: the profile's own (`--deploy-config`'s `model:`, else the assistant's)
    args.model = args.model or profile.model
    try:
        gateway = GatewayConfig(
            api_key=args.api_key or os.environ.get("VOICE_GATEWAY_API_KEY") or None,
            max_sessions=args.max_sessions,
            max_session_s=args.max_session_seconds,
            max_stored_audio_s=args.max_stored_audio_seconds,
            opus_bitrate_bps=args.opus_bitrate,
            allowed_origins=args.allowed_origins,
            allowed_hosts=(*_served_hosts(args.host), *args.allowed_hosts),
            public_metrics=args.public_metrics,
            header_timeout_s=args.header_timeout,
            body_timeout_s=args.body_timeout,
            images=ImageLimits(max_image_bytes=args.max_image_bytes, max_image_pixels=args.max_image_pixels,
                               fetch_hosts=args.image_fetch_hosts),
        )
    except ValueError as e:
        log.error("%s", e)
        return 2
    webrtc = WebRTCConfig(host_addresses=tuple(args.webrtc_host_address))
    try:
        phone = _phone_settings(os.environ)
    except ValueError as e:
        log.error("%s", e)
        return 2
    # uvicorn's own HTTP protocols plus read deadlines: it has none for a client that sends a request too slowly
    http = http_protocol(args.http, ReadTimeouts(gateway.header_timeout_s, gateway.body_timeout_s))
    uvicorn_args = dict(host=args.host, port=args.port, log_level=args.log_level.lower(), loop=args.loop, http=http,
                        # Above the 15 MiB append limit once base64-encoded, so an oversize append gets an error event.
                        ws_max_size=32 * 1024 * 1024,
                        # then still-open connections are cut, and the lifespan's engine stop fails their requests
                        timeout_graceful_shutdown=args.shutdown_timeout)
    workers = profile.engine.http_workers if args.http_workers is None else args.http_workers
    if workers < 1:
        log.error("--http-workers must be at least 1, got %d", workers)
        return 2
    if workers > 1:
        return _serve_workers(args, workers, profile, gateway, webrtc, phone, uvicorn_args)
    try:
        engine = create_engine(args.model, profile, args.cache_dir)
    except (EngineError, FileNotFoundError) as e:
        log.error("%s", e)
        return 2
    uvicorn.run(create_app(engine, gateway, webrtc, phone=phone), **uvicorn_args)
    return 0


def _phone_settings(env: Mapping[str, str]) -> PhoneConfig:
    """Phone calls' settings from the environment (docs/phone.md lists the variables): secrets stay off the
    command line, where `ps` would show them."""
    from voice_gateway.phone import PhoneConfig

    def get(name: str) -> str | None:
        return env.get(f"VOICE_GATEWAY_{name}") or None

    tools = get("PHONE_TOOLS")
    return PhoneConfig(
        twilio_auth_token=get("TWILIO_AUTH_TOKEN"), twilio_account_sid=get("TWILIO_ACCOUNT_SID"),
        twilio_api_base=get("TWILIO_API_BASE"), public_url=get("PUBLIC_URL"), carrier_secret=get("PHONE_SECRET"),
        app_webhook_url=get("PHONE_WEBHOOK_URL"), app_webhook_secret=get("PHONE_WEBHOOK_SECRET"),
        call_tools=tuple(t for t in (tools or "").split(",") if t),
        dtmf_items=get("PHONE_DTMF_ITEMS") in ("1", "true", "yes"))


def _serve_workers(args: argparse.Namespace, workers: int, profile: DeployProfile, gateway: GatewayConfig,
                   webrtc: WebRTCConfig, phone: PhoneConfig, uvicorn_args: dict[str, Any]) -> int:
    """One engine process (or the replicas on Ray) and `workers` uvicorn server processes attached to it. The server
    processes start while an engine process starts (each imports torch and transformers meanwhile, and waits for
    its socket); replicas on Ray are started first."""
    import shutil
    import tempfile
    import threading

    import uvicorn

    from engine import EngineError
    from engine.deploy import EngineHost, ReplicaHost
    from voice_gateway.app import WorkerSpec

    host = (ReplicaHost if profile.engine.where == "ray" else EngineHost)(args.model, profile, args.cache_dir)
    failed = threading.Event()
    if isinstance(host, EngineHost):
        threading.Thread(target=_start_beside, args=(host, failed), name="engine-start", daemon=True).start()
    else:
        try:
            host.start()
        except (EngineError, FileNotFoundError) as e:
            log.error("%s", e)
            host.stop()
            return 2
    assert host.address is not None
    metrics_dir = Path(tempfile.mkdtemp(prefix="vg-metrics-"))
    phone_dir = Path(tempfile.mkdtemp(prefix="vg-calls-"))
    log.info("%d HTTP workers share their phone calls in %s", workers, phone_dir)
    WorkerSpec(host.address, args.log_level.upper(), metrics_dir, gateway, webrtc, phone, phone_dir).publish()
    try:
        # A spawned worker imports torch and transformers before it answers uvicorn's health pings: on a
        # loaded host that takes longer than uvicorn's 5 s, which would kill and respawn each worker in turn.
        uvicorn.run("voice_gateway.app:worker_app", factory=True, workers=workers, timeout_worker_healthcheck=60,
                    **uvicorn_args)
    finally:
        host.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)
        shutil.rmtree(phone_dir, ignore_errors=True)
    return 2 if failed.is_set() else 0


def _start_beside(host: EngineHost, failed: threading.Event) -> None:
    """The engine process's start, beside uvicorn's: when it fails, its socket's folder goes (the server processes
    waiting for it give up) and uvicorn's supervisor is told to stop, once it listens for that."""
    import signal
    import time

    from engine import EngineError

    try:
        host.start()
    except (EngineError, FileNotFoundError) as e:
        log.error("%s", e)
        failed.set()
        host.stop()
        while signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="voice-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_arguments(sub.add_parser("serve", help="run the server"))
    probe_cli.add_probe_commands(sub)
    bench_parser = sub.add_parser("bench", help="load-test a running server, or a ladder of servers (--ladder)")
    if argv[:1] == ["bench"]:
        # the bench is its own package with its own extra: the server neither imports nor needs it
        if probe_cli.without_bench_extra("bench"):
            return 2
        import bench

        bench.add_bench_arguments(bench_parser)
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(args)
    if args.command in probe_cli.PROBES:
        return probe_cli.run_probe(args, argv)
    return bench.bench_main(args, ["voice-gateway", *argv])


if __name__ == "__main__":
    sys.exit(main())
