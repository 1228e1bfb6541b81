"""Gateway metrics (sessions, turn latency, chat first-chunk latency, cancellations); the engine keeps its own
registry. Behind `serve --http-workers N` every worker writes its figures to a folder they share and
/metrics sums them all."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

_TURN_BUCKETS_S = (0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's name for the shared folder


class GatewayMetrics:
    """Owns the gateway's families; with `shared_dir` they live in files, one per process, summed on exposition."""

    def __init__(self, shared_dir: Path | None = None) -> None:
        self.shared_dir = shared_dir
        self.registry = CollectorRegistry()
        r = self.registry
        # livesum: across workers, the sessions of the processes still running
        self.active_sessions = Gauge("gateway_active_sessions", "Open realtime sessions", ["transport"], registry=r,
                                     multiprocess_mode="livesum")
        self.turn_latency = Histogram(
            "gateway_speech_stop_to_first_audio_seconds",
            "From the end of the user's speech (VAD) to the reply's first audio sent",
            buckets=_TURN_BUCKETS_S,
            registry=r,
        )
        self.cancelled_responses = Counter(
            "gateway_cancelled_responses", "Responses cancelled before they finished", ["reason"], registry=r
        )
        self.protocol_errors = Counter("gateway_protocol_errors", "Error events sent to clients", ["code"], registry=r)
        self.refused_sessions = Counter("gateway_refused_sessions", "Sessions refused at connect", ["reason"], registry=r)
        # against engine_ttft/ttfp_seconds (from submit to the engine's event): what the HTTP side adds
        self.chat_ttft = Histogram(
            "gateway_chat_ttft_seconds", "Chat completion: request handed to the app to its first text chunk written",
            buckets=_TURN_BUCKETS_S, registry=r,
        )
        # a picture's share of what the server does before the engine, beside its prompt and the crossing
        self.image_decode = Histogram(
            "gateway_image_decode_seconds",
            "A picture's bytes to its pixels, as its request waits for them: a worker thread, then its decoding",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0), registry=r,
        )
        self.chat_ttfp = Histogram(
            "gateway_chat_ttfp_seconds", "Chat completion: request handed to the app to its first audio chunk written",
            buckets=_TURN_BUCKETS_S, registry=r,
        )

    def exposition(self) -> bytes:
        """The gateway's families in Prometheus' text format: this process's, or every process's summed."""
        if self.shared_dir is None:
            return generate_latest(self.registry)
        _forget_dead_processes(self.shared_dir)
        summed = CollectorRegistry()
        summed.register(_GatewayFamilies(self.shared_dir))
        return generate_latest(summed)


def shared_across_processes(shared_dir: Path) -> GatewayMetrics:
    """Gateway metrics for one of several server processes that write to `shared_dir`. prometheus-client takes its
    value class from PROMETHEUS_MULTIPROC_DIR when first imported, which a worker has done before it learns the
    folder, so the class is set here, before the process makes its first metric; every metric it makes after this
    lives in the folder (`exposition` reads back the gateway's families only)."""
    os.environ[MULTIPROC_ENV] = str(shared_dir)
    values.ValueClass = values.MultiProcessValue()
    return GatewayMetrics(shared_dir)


class _GatewayFamilies:
    """Every process's gateway families from the shared folder, summed by prometheus-client."""

    def __init__(self, shared_dir: Path) -> None:
        self._collector = MultiProcessCollector(None, path=str(shared_dir))

    def collect(self) -> Iterator[Metric]:
        return (m for m in self._collector.collect() if m.name.startswith("gateway_"))


_LIVE_GAUGE_FILE = re.compile(r"gauge_live\w*?_(\d+)\.db")


def _forget_dead_processes(shared_dir: Path) -> None:
    """A dead worker's live gauges (open sessions) are dropped; its counters stay in the sums, as counters do."""
    for path in shared_dir.glob("gauge_live*.db"):
        if (m := _LIVE_GAUGE_FILE.fullmatch(path.name)) and not _alive(pid := int(m.group(1))):
            mark_process_dead(pid, str(shared_dir))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
