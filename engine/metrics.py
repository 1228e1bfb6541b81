"""Engine metrics: per-request timings (TTFT, TTFP, RTF, inter-chunk gaps), per-stage batch, queue and step
time, the audio tower's time, prompt tokens prefilled or reused, work done after ready (`ColdWork`),
and whether an engine process is up and how often it was restarted."""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

log = logging.getLogger(__name__)

_LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class EngineMetrics:
    """Owns one registry, so several engines (tests) can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("engine_ttft_seconds", "Submit to first text token", buckets=_LATENCY_BUCKETS_S, registry=r)
        self.ttfp = Histogram("engine_ttfp_seconds", "Submit to first audio chunk", buckets=_LATENCY_BUCKETS_S, registry=r)
        # engine/api.py FirstPacketParts: queued, thinker, talker_prefill, talker_frames, code2wav
        self.first_packet = Histogram("engine_first_packet_part_seconds", "Submit to first audio chunk, by the part "
                                      "each stage took", ["part"], buckets=_LATENCY_BUCKETS_S, registry=r)
        self.rtf = Histogram(
            "engine_rtf", "Time to last audio / audio duration", buckets=(0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 5), registry=r
        )
        self.chunk_gap = Histogram(
            "engine_inter_chunk_gap_seconds", "Time between audio chunks of one request", buckets=_LATENCY_BUCKETS_S, registry=r
        )
        self.requests = Counter("engine_requests", "Finished requests by outcome", ["outcome"], registry=r)
        self.active = Gauge("engine_active_requests", "Requests inside the engine", registry=r)
        self.batch_size = Histogram(
            "engine_stage_batch_size", "Requests per forward, per stage", ["stage"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.step_seconds = Histogram(
            "engine_stage_step_seconds", "Wall time of one stage step (one batched forward), by phase (prefill, decode)",
            ["stage", "phase"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=r,
        )
        self.step_tokens = Histogram(
            "engine_thinker_step_tokens", "Tokens of one packed Thinker step, by kind (prompt pieces, decode rows)",
            ["kind"], buckets=(0, 1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192), registry=r,
        )
        self.reply_gap = Histogram(
            "engine_reply_gap_seconds",
            "Time between a speaking reply's consecutive outputs, per stage (Thinker: text tokens, Talker: frames)",
            ["stage"], buckets=(0.01, 0.02, 0.04, 0.06, 0.08, 0.12, 0.16, 0.25, 0.5, 1.0), registry=r,
        )
        self.playback_slack = Histogram(
            "engine_playback_slack_seconds",
            "The least audio a speaking reply's listener holds, after each Code2Wav step",
            buckets=(-0.5, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0), registry=r,
        )
        self.audio_tower = Histogram(
            "engine_audio_tower_seconds", "Host time of the Thinker's audio tower over one prefill's clips",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0), registry=r,
        )
        self.vision_tower = Histogram(
            "engine_vision_tower_seconds", "Host time of the Thinker's vision tower over one step's pictures",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0), registry=r,
        )
        self.queue_depth = Gauge("engine_stage_queue_depth", "Requests waiting to join a stage's batch", ["stage"], registry=r)
        self.running = Gauge("engine_stage_running", "Requests held by a stage", ["stage"], registry=r)
        self.prompt_tokens = Counter(
            "engine_prompt_tokens", "Prompt tokens of finished Thinker requests, by whether a cached prefix held them",
            ["source"], registry=r,
        )
        self.talker_prompt_rows = Counter(
            "engine_talker_prompt_rows", "Talker prompt rows, by whether a slot kept from the conversation's last "
            "reply held them (cached) or a step prefilled them", ["source"], registry=r,
        )
        self.talker_kv_pages = Gauge("engine_talker_kv_pages", "The Talker's KV pages by what holds them: replies "
                                     "(speaking or prefilling), kept (a conversation's user rows) or free", ["holder"],
                                     registry=r)
        self.cold_work = ColdWork(r)
        self.prefix = PrefixCacheMetrics(r)


class PrefixCacheMetrics:
    """The Thinker's kept prefixes (engine/omni/runners/prefix_cache.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.lookups = Counter(
            "engine_prefix_lookups", "Prompts that looked for a cached prefix, by where one was found (slot, host) "
            "or not (miss)", ["outcome"], registry=registry,
        )
        self.evictions = Counter(
            "engine_prefix_evictions", "Kept prefixes whose slot was given back, by what became of them (to_host: "
            "moved to the host pool; dropped: gone, from a slot or from the full pool)", ["fate"], registry=registry,
        )
        self.host_bytes = Gauge("engine_prefix_host_bytes", "Bytes the host pool of kept prefixes holds",
                                registry=registry)
        self.kv_pages = Gauge("engine_kv_pages", "The Thinker's KV pages by what holds them: requests (running or "
                              "prefilling), kept (kept prefixes) or free", ["holder"], registry=registry)


class ProcessMetrics:
    """An engine process as the server process in front of it sees it, beside the families the child pushes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.up = Gauge("engine_process_up", "1 while the engine process serves, 0 while it is down or restarting",
                        registry=registry)
        self.restarts = Counter(
            "engine_process_restarts",
            "Engine processes started (or rejoined) after one was lost, by how it was lost (exited, stalled)",
            ["cause"], registry=registry,
        )


TORCH_COMPILE = "torch_compile"
TRITON_COMPILE = "triton_compile"
EAGER_FALLBACK = "eager_fallback"  # a step that graphs exist for, run eagerly (no bucket fits it)
UNWARMED_SHAPE = "unwarmed_shape"  # an eager module met with a shape start-up did not warm

_lock = threading.Lock()
_armed: list[ColdWork] = []
_hooked = False


class ColdWork:
    """Work done while serving that start-up should have done (compiles, kernel builds, steps off their graphs), which
    costs the request that meets it: counted in `engine_cold_work_total{kind}` and logged. Compiles are heard through
    process-wide hooks (torch._dynamo's compile callbacks, Triton's JIT post-compile hook); stages report their own
    fallbacks with `record`. `arm()` once the engine is ready: what start-up does is not cold work."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.total = Counter(
            "engine_cold_work",
            "Compiles, kernel builds and graph fallbacks after the engine was ready, by kind",
            ["kind"], registry=registry,
        )
        for kind in (TORCH_COMPILE, TRITON_COMPILE, EAGER_FALLBACK, UNWARMED_SHAPE):
            self.total.labels(kind)
        self.armed = False

    def arm(self) -> None:
        _install_hooks()
        with _lock:
            if not self.armed:
                _armed.append(self)
                self.armed = True

    def disarm(self) -> None:
        with _lock:
            if self.armed:
                _armed.remove(self)
                self.armed = False

    def record(self, kind: str, what: str) -> None:
        """Count one event (stages call this from their threads); nothing before `arm()`."""
        if self.armed:
            self.total.labels(kind).inc()
            log.warning("cold work after ready (%s): %s", kind, what)

    def count(self, kind: str) -> float:
        return self.total.labels(kind)._value.get()


def _record_all(kind: str, what: str) -> None:
    with _lock:
        watchers = list(_armed)
    for watcher in watchers:
        watcher.record(kind, what)


def _install_hooks() -> None:
    global _hooked
    with _lock:
        if _hooked:
            return
        _hooked = True
    from torch._dynamo.callback import callback_handler

    callback_handler.register_start_callback(lambda args: _record_all(TORCH_COMPILE, f"compile {args.compile_id}"))
    try:
        from triton import knobs
    except ImportError:  # no triton (a CPU install), or one too old to have knobs: no Triton builds to see
        return
    previous = knobs.runtime.jit_post_compile_hook

    def on_triton_compile(*, repr: str, **kwargs: Any) -> Any:
        _record_all(TRITON_COMPILE, repr)
        return previous(repr=repr, **kwargs) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = on_triton_compile
