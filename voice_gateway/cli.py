"""`voice-gateway serve [MODEL]`, `voice-gateway accuracy`, `voice-gateway kernels`, `voice-gateway steps` and
`voice-gateway bench`."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import DeployProfile, EngineError, ProfileError, create_engine, load_profile

if TYPE_CHECKING:
    from voice_gateway.config import GatewayConfig
    from voice_gateway.webrtc import WebRTCConfig

log = logging.getLogger("voice_gateway")


def _serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model", nargs="?", default="assistant",
        help="'assistant' (the default: small real models on the CPU that hear, answer and speak; "
        "docs/deployment.md), 'tiny' (Qwen3-Omni's architecture with random weights, for tests), a local "
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
    # which cost the server's one event loop less Python per request and per event (docs/performance.md)
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

    from voice_gateway.app import create_app
    from voice_gateway.config import GatewayConfig
    from voice_gateway.media.images import ImageLimits
    from voice_gateway.read_deadline import ReadTimeouts, http_protocol
    from voice_gateway.webrtc import WebRTCConfig

    try:
        profile = load_profile(args.deploy_config, model=args.model, stage_overrides=args.stage_overrides,
                               overrides=args.overrides)
    except ProfileError as e:
        log.error("bad deploy profile: %s", e)
        return 2
    log.info("deploy profile %s: %s", profile.name, profile)
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
        return _serve_workers(args, workers, profile, gateway, webrtc, uvicorn_args)
    try:
        engine = create_engine(args.model, profile, args.cache_dir)
    except (EngineError, FileNotFoundError) as e:
        log.error("%s", e)
        return 2
    uvicorn.run(create_app(engine, gateway, webrtc), **uvicorn_args)
    return 0


def _serve_workers(args: argparse.Namespace, workers: int, profile: DeployProfile, gateway: GatewayConfig,
                   webrtc: WebRTCConfig, uvicorn_args: dict[str, Any]) -> int:
    """One engine process (or the profile's replicas on Ray), then `workers` server processes attached to it
    (uvicorn's workers)."""
    import shutil
    import tempfile

    import uvicorn

    from engine.deploy import EngineHost, ReplicaHost
    from voice_gateway.app import WorkerSpec

    host = (ReplicaHost if profile.engine.where == "ray" else EngineHost)(args.model, profile, args.cache_dir)
    try:
        host.start()
    except (EngineError, FileNotFoundError) as e:
        log.error("%s", e)
        host.stop()
        return 2
    assert host.address is not None
    metrics_dir = Path(tempfile.mkdtemp(prefix="vg-metrics-"))
    WorkerSpec(host.address, args.log_level.upper(), metrics_dir, gateway, webrtc).publish()
    try:
        # A spawned worker imports torch and transformers before it answers uvicorn's health pings: on a
        # loaded host that takes longer than uvicorn's 5 s, and each worker was killed and respawned in turn.
        uvicorn.run("voice_gateway.app:worker_app", factory=True, workers=workers, timeout_worker_healthcheck=60,
                    **uvicorn_args)
    finally:
        host.stop()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def _accuracy_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("model", nargs="?", default="tiny", help="'tiny' (the default), a Qwen3-Omni checkpoint directory or cached id")
    add("--load-format", choices=("auto", "dummy"), default="auto",
        help="dummy: the released dimensions with random weights (seeded by --seed)")
    add("--device", default="cpu", help="cpu (FP8 emulated: dequantized experts) or cuda (the Triton kernels)")
    add("--steps", type=int, default=256, help="greedy decode steps compared (default 256)")
    add("--seed", type=int, default=0)
    add("--out", type=Path, required=True, help="the JSON report")
    add("--cache-dir", type=Path, help="where the tiny checkpoint is built (default ~/.cache/voice-gateway)")
    add("--log-level", default="info")


def accuracy(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway accuracy`: engine/accuracy.py's report as JSON, and its table on stdout."""
    import json
    import platform

    from engine.deploy import measure_accuracy

    if args.steps < 1:
        print("voice-gateway accuracy: --steps must be at least 1", file=sys.stderr)
        return 2
    try:
        report = measure_accuracy(args.model, load_format=args.load_format, device=args.device, steps=args.steps,
                                  seed=args.seed, cache_dir=args.cache_dir).as_dict()
    except (EngineError, ValueError, RuntimeError) as e:
        print(f"voice-gateway accuracy: {e}", file=sys.stderr)
        return 1
    import torch

    report["machine"] = {"platform": platform.platform(), "torch": torch.__version__,
                         "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else None}
    report["command"] = shlex.join(["voice-gateway", *argv])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{'stage':8} {'variant':8} {'logits rel.err':>15} {'hidden rel.err':>15} {'top-1':>7} {'top-10':>7}")
    for stage in ("thinker", "talker"):
        for variant, a in report[stage].items():
            print(f"{stage:8} {variant:8} {a['logits_rel_error']:15.2e} {a['hidden_rel_error']:15.2e} "
                  f"{a['top1_agreement']:7.3f} {a['top10_overlap']:7.3f}")
    print(f"wrote {args.out}")
    return 0


def _kernels_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--out-dir", type=Path, required=True,
        help="where experts.json, predictor.json, attention.json and their figures go")
    add("--tokens", default=None, help="the experts' comma-separated token counts (default: 1 to 4,096)")
    add("--batches", default=None, help="the code predictor's comma-separated batch sizes (default: 1,16,64,128)")
    add("--replays", type=int, default=30, help="graph replays a measurement (default 30)")
    add("--log-level", default="info")


def kernels(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway kernels`: engine/experts_timing.py's, engine/predictor_timing.py's and
    engine/attention_timing.py's figures as JSON (with the machine and the commit, as the bench records its runs),
    a figure each, and tables on stdout."""
    from engine.deploy import measure_attention_timing, measure_experts_timing, measure_predictor_timing

    if _without_bench_extra("kernels"):
        return 2
    from bench.plots import plot_attention_timing, plot_experts_timing, plot_predictor_timing

    try:
        tokens, batches = _counts(args.tokens, "--tokens"), _counts(args.batches, "--batches")
        if args.replays < 1:
            raise ValueError("--replays takes a positive count")
        timings = measure_experts_timing(tokens, replays=args.replays)
        frames = measure_predictor_timing(batches, replays=args.replays)
        calls = measure_attention_timing(replays=args.replays)
    except (ValueError, RuntimeError) as e:
        print(f"voice-gateway kernels: {e}", file=sys.stderr)
        return 1
    record = _record(args.out_dir, argv, with_gpu=True)
    print(f"{'stage':8} {'tokens':>7} {'bf16 us':>9} {'fp8 us':>9} {'fp8/bf16':>9}", *(
        f"{t.stage:8} {t.tokens:7d} {t.bf16_us:9.1f} {t.fp8_us:9.1f} {t.fp8_over_bf16:9.2f}" for t in timings), sep="\n")
    _write_timings(args.out_dir / "experts.json", "one layer's fused experts, bf16 against FP8, each call in a CUDA "
                   "graph (microseconds)", record, [t.as_dict() for t in timings], plot_experts_timing)
    print(f"{'attention':10} {'batch':>6} {'frame ms':>9} {'kernels':>8} {'codes = torch':>14}", *(
        f"{f.attention:10} {f.batch:6d} {f.frame_ms:9.3f} {f.kernels:8d} {f.codes_equal_torch:14.4f}" for f in frames),
        sep="\n")
    _write_timings(args.out_dir / "predictor.json", "one frame of the code predictor (15 passes, sampling included), "
                   "compiled and replayed from a CUDA graph, by its attention's form (milliseconds)", record,
                   [f.as_dict() for f in frames], plot_predictor_timing)
    print(f"{'rows':>5} {'context':>8} {'splits':>7} {'us':>8} {'GB/s':>8}", *(
        f"{c.batch:5d} {c.context:8d} {c.splits:7d} {c.call_us:8.1f} {c.gb_per_s:8.1f}" for c in calls), sep="\n")
    _write_timings(args.out_dir / "attention.json", "one layer's attention for decode rows over a context, the keys "
                   "split into shares or not, replayed from a CUDA graph (microseconds)", record,
                   [c.as_dict() for c in calls], plot_attention_timing)
    return 0


def _steps_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("model", nargs="?", default="tiny", help="'tiny' (the default), a Qwen3-Omni checkpoint directory or cached id")
    add("--load-format", choices=("auto", "dummy"), default="auto", help="dummy: the released dimensions, random weights")
    add("--device", default="cpu", help="cpu (float32, eager) or cuda (bf16, the Triton kernels, graphs)")
    add("--quantization", choices=("none", "fp8"), default="none", help="fp8: the Thinker's experts in e4m3")
    add("--rows", default=None, help="comma-separated decode rows a step (default 1,16,32,64)")
    add("--contexts", default=None, help="comma-separated positions each row attends over (default 256,2048,4096,8192)")
    add("--prompts", default=None, help="comma-separated prompt tokens a step carries beside the rows, in pieces of "
        "128, each after its own context (default 0,1024)")
    add("--replays", type=int, default=20, help="steps timed a measurement (default 20)")
    add("--out-dir", type=Path, required=True, help="where steps.json and steps.png go")
    add("--cache-dir", type=Path, help="where the tiny checkpoint is built (default ~/.cache/voice-gateway)")
    add("--log-level", default="info")


def steps(args: argparse.Namespace, argv: list[str]) -> int:
    """`voice-gateway steps`: engine/step_timing.py's Thinker steps as JSON, a figure and a table."""
    from engine.deploy import measure_step_timing

    if _without_bench_extra("steps"):
        return 2
    from bench.plots import plot_step_timing

    try:
        rows, contexts = _counts(args.rows, "--rows"), _counts(args.contexts, "--contexts")
        prompts = _counts(args.prompts, "--prompts", least=0)
        if args.replays < 1:
            raise ValueError("--replays takes a positive count")
        timings = measure_step_timing(args.model, load_format=args.load_format, device=args.device,
                                      quantization=args.quantization, replays=args.replays, cache_dir=args.cache_dir,
                                      **({"rows": rows} if rows else {}), **({"contexts": contexts} if contexts else {}),
                                      **({"prompts": prompts} if prompts else {}))
    except (EngineError, ValueError, RuntimeError) as e:
        print(f"voice-gateway steps: {e}", file=sys.stderr)
        return 1
    record = _record(args.out_dir, argv, with_gpu=args.device.startswith("cuda"))
    print(f"{'rows':>5} {'context':>8} {'prompt':>7} {'step ms':>9} {'KV GB':>8}", *(
        f"{t.rows:5d} {t.context:8d} {t.prompt:7d} {t.step_ms:9.3f} {t.kv_gb:8.3f}" for t in timings), sep="\n")
    _write_timings(args.out_dir / "steps.json", f"one Thinker step of {args.model} ({args.load_format}) on "
                   f"{args.device}, its experts {args.quantization if args.quantization != 'none' else 'as loaded'}, "
                   "by decode rows, the context each attends over and the prompt tokens beside them (milliseconds)", record,
                   [t.as_dict() for t in timings], plot_step_timing)
    return 0


def _record(out_dir: Path, argv: list[str], *, with_gpu: bool) -> dict[str, Any]:
    """What a timing's JSON records beside its rows, as the bench records its runs: the machine, the commit and the
    command; `out_dir` made ready for it."""
    from bench.machine import git_commit, machine_info

    out_dir.mkdir(parents=True, exist_ok=True)
    return {"machine": machine_info(with_gpu=with_gpu), "git_commit": git_commit(),
            "command": shlex.join(["voice-gateway", *argv])}


def _write_timings(out: Path, what: str, record: dict[str, Any], rows: list[dict[str, Any]],
                   plot: Callable[[Path, Path], Path]) -> None:
    """One of the kernels' or steps' JSON files (what it measured, `_record`'s, its rows) and its figure beside it."""
    import json

    out.write_text(json.dumps({"what": what, **record, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out} and {plot(out, out.with_suffix('.png'))}")


def _counts(text: str | None, flag: str, least: int = 1) -> tuple[int, ...] | None:
    """A comma-separated list of counts of at least `least`, or None for the default."""
    if text is None:
        return None
    try:
        counts = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated counts, not {text!r}") from None
    if min(counts) < least:
        raise ValueError(f"{flag} takes comma-separated counts of at least {least}, not {text!r}")
    return counts


def _without_bench_extra(command: str) -> bool:
    """Whether the bench extra (the bench, its figures and tables) is missing; if so, says how to install it."""
    if missing := [m for m in ("matplotlib", "rich") if importlib.util.find_spec(m) is None]:
        print(f"voice-gateway {command}: {', '.join(missing)} missing; pip install 'voice-gateway[bench]'", file=sys.stderr)
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="voice-gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_arguments(sub.add_parser("serve", help="run the server"))
    _accuracy_arguments(sub.add_parser("accuracy", help="bf16 and FP8 experts against float32 on one model's "
                                       "weights: logits, the Talker's rows, top-token agreement"))
    _kernels_arguments(sub.add_parser("kernels", help="bf16 and FP8 experts' time and a code predictor frame's on a "
                                      "CUDA GPU, at the released model's shapes"))
    _steps_arguments(sub.add_parser("steps", help="a Thinker step's time by decode rows, context and the prompt "
                                    "tokens beside them (how a long call's steps grow)"))
    bench_parser = sub.add_parser("bench", help="load-test a running server, or a ladder of servers (--ladder)")
    if argv[:1] == ["bench"]:
        # the bench is its own package with its own extra: the server neither imports nor needs it
        if _without_bench_extra("bench"):
            return 2
        import bench

        bench.add_bench_arguments(bench_parser)
    args = parser.parse_args(argv)
    level = getattr(args, "log_level", "info").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "serve":
        return serve(args)
    if args.command == "accuracy":
        return accuracy(args, argv)
    if args.command == "kernels":
        return kernels(args, argv)
    if args.command == "steps":
        return steps(args, argv)
    return bench.bench_main(args, ["voice-gateway", *argv])


if __name__ == "__main__":
    sys.exit(main())
