"""The engine's deploy face: what a server's entry points (voice_gateway/cli.py, app.py; import-linter checks that
they alone import it) use to run the engine for several server processes and reach it from each of them.

`EngineHost` keeps one engine process for `serve --http-workers N`, at an `Address` each server process reaches
through `attach_engine`; `ReplicaHost` launches replicas on Ray, at a `RayAddress` reached through
`attach_replicas`; `EngineAt` is either. `freeze_startup_heap` / `thaw_heap`: engine/remote/heap.py."""

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
