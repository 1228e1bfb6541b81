"""The engine's deploy face: what a server's entry points (voice_gateway/cli.py, app.py; import-linter
checks that they alone import it) use to run the engine for several server processes, reach it from each
of them, and keep a serving process's start-up objects out of the cyclic collector.

`EngineHost` keeps one engine process for `serve --http-workers N`, at an `Address` each server process
reaches through `attach_engine`; `ReplicaHost` launches the engine replicas on Ray, at a `RayAddress` each
reaches through `attach_replicas`. `EngineAt` is either address: what a server process is told of where
its engine is. `freeze_startup_heap` / `thaw_heap`: a serving process's start-up objects out of the
collector, and back (engine/remote/heap.py).
"""

from engine.factory import attach_engine, attach_replicas
from engine.remote.heap import freeze_startup_heap, thaw_heap
from engine.remote.host import EngineHost
from engine.remote.messages import Address
from engine.replicas.cluster import RayAddress, ReplicaHost

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
    "thaw_heap",
]
