"""The engine's deploy face: what a server's entry points (voice_gateway/cli.py, app.py; import-linter
checks that they alone import it) use to run the engine for several server processes, reach it from each
of them, and keep a serving process's start-up objects out of the cyclic collector.

`EngineHost` keeps one engine process for `serve --http-workers N`, at an `Address` each server process
reaches through `attach_engine`; `ReplicaHost` launches the engine replicas on Ray, at a `RayAddress` each
reaches through `attach_replicas`. `EngineAt` is either address: what a server process is told of where
its engine is. `freeze_startup_heap` / `thaw_heap`: a serving process's start-up objects out of the
collector, and back (engine/heap.py). `measure_accuracy`: bf16 and FP8 against float32 on one model's weights
(engine/accuracy.py), for `voice-gateway accuracy`; `measure_experts_timing`: bf16 and FP8 experts' time
(engine/experts_timing.py), `measure_predictor_timing`: a code predictor frame's (engine/predictor_timing.py) and
`measure_attention_timing`: decode rows' attention over long contexts (engine/attention_timing.py), for
`voice-gateway kernels`; `measure_step_timing`: a Thinker decode step by rows and context (engine/step_timing.py),
for `voice-gateway steps`.
"""

from engine.accuracy import measure as measure_accuracy
from engine.attention_timing import measure as measure_attention_timing
from engine.experts_timing import measure as measure_experts_timing
from engine.factory import attach_engine, attach_replicas
from engine.heap import freeze_startup_heap, thaw_heap
from engine.predictor_timing import measure as measure_predictor_timing
from engine.remote.host import EngineHost
from engine.remote.messages import Address
from engine.replicas.cluster import RayAddress, ReplicaHost
from engine.step_timing import measure as measure_step_timing

EngineAt = Address | RayAddress

__all__ = [
    "Address",
    "EngineAt",
    "EngineHost",
    "RayAddress",
    "ReplicaHost",
    "attach_engine",
    "attach_replicas",
    "freeze_startup_heap",
    "measure_accuracy",
    "measure_attention_timing",
    "measure_experts_timing",
    "measure_predictor_timing",
    "measure_step_timing",
    "thaw_heap",
]
