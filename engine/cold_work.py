"""Work done while serving that start-up should have done: compiles, kernel builds, steps off their graphs.

Everything the GPU profile compiles, captures or warms happens before the engine reports ready; any
of it later costs the request that meets it 0.2-2 s (a Triton kernel built for a new specialisation
of its integer arguments, a torch.compile recompile for a new shape, a prefill that fits no graph
and runs eagerly). `ColdWork` counts each event in `engine_cold_work_total{kind}` and logs it, so a
latency spike can be traced to its cause and a test can check that a steady run has none.

Compiles are seen through process-wide hooks (torch._dynamo's compile callbacks, Triton's JIT
post-compile hook); every armed `ColdWork` of the process hears them. Stages report their own
fallbacks with `record`.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

TORCH_COMPILE = "torch_compile"
TRITON_COMPILE = "triton_compile"
EAGER_FALLBACK = "eager_fallback"  # a step that graphs exist for, run eagerly (no bucket fits it)
UNWARMED_SHAPE = "unwarmed_shape"  # an eager module met with a shape start-up did not warm

_lock = threading.Lock()
_armed: list[ColdWork] = []
_hooked = False


class ColdWork:
    """One engine's count; `arm()` once it is ready (what start-up does is not cold work)."""

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
