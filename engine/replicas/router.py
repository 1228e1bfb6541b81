"""Several engine replicas as one `EngineCore`, each a `RemoteCore` that keeps its replica serving: a request goes
to the replica that ran its conversation's last turn, else to the one every process sends the conversation it
names, else to the least loaded that serves (affinity.py); health, stage load and metrics are the replicas'
together.

One server process launches the replicas, or attaches to those the parent of `serve --http-workers N` launched
(cluster.py). Load is the replicas' own count for every process, so least loaded holds across processes; kept
prompts are each process's own (a realtime session's turns all reach the process that holds its socket). A lost
replica leaves the rotation until it serves again: while one serves the engine is `degraded`, not down."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.api import OVERLOADED, UNAVAILABLE, EngineError, EngineHealth, Failed, Finished, OutputEvent
from engine.core import Sink
from engine.handoff import AdmittedRequest
from engine.remote.client import PushedFamilies, RemoteCore
from engine.remote.messages import EngineSpec
from engine.replicas.affinity import ConversationAffinity, rendezvous
from engine.replicas.cluster import RayCluster
from engine.replicas.replica import ReachReplica


class _ReplicaStates(Collector):
    """Whether each replica serves, and its restarts."""

    def __init__(self, replicas: list[RemoteCore]) -> None:
        self._replicas = replicas

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("engine_replica_up", "1 while the engine replica serves", labels=["replica"])
        restarts = GaugeMetricFamily("engine_replica_restarts", "Times the engine replica served again after it "
                                     "was lost", labels=["replica"])
        for name, replica in enumerate(self._replicas):
            up.add_metric([str(name)], 1.0 if replica.serving else 0.0)
            restarts.add_metric([str(name)], replica.restarts)
        return [up, restarts]


class ReplicaSet:
    """Owns the replicas (a `RemoteCore` each, named by index), which replica each open request runs on (and which were
    aborted), and the conversations' affinity. `spec`: what to launch; None to attach to replicas launched already."""

    def __init__(self, cluster: RayCluster, spec: EngineSpec | None) -> None:
        self._cluster = cluster
        self._launch = spec
        self.replicas: list[RemoteCore] = []
        self._routes: dict[str, int] = {}  # request id -> its replica's index
        self._aborted: set[str] = set()  # open requests whose abort was sent
        self.affinity = ConversationAffinity()
        self.registry = CollectorRegistry()
        self.registry.register(PushedFamilies(lambda: [({"replica": str(i)}, r.metrics_text)
                                                       for i, r in enumerate(self.replicas)]))
        self.registry.register(_ReplicaStates(self.replicas))

    @property
    def spec(self) -> EngineSpec:
        return self._launch or self.replicas[0].spec

    async def start(self) -> None:
        try:
            # its actors' output goes to the log of the process that launched them, once
            self._cluster.connect(log_to_driver=self._launch is not None)
            actors = self._cluster.launch(self._launch) if self._launch is not None else self._cluster.lookup()
            self.replicas.extend(RemoteCore(ReachReplica(str(i), actor)) for i, actor in enumerate(actors))
            await asyncio.gather(*(replica.start() for replica in self.replicas))
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await asyncio.gather(*(replica.stop() for replica in self.replicas))
        await self._cluster.stop()

    def begin(self, request: AdmittedRequest, sink: Sink) -> None:
        """On the replica that ran the conversation's last turn, else the least loaded. A request refused or lost before
        any of its events came goes once to another that serves: nothing of it reached the client yet."""
        rid = request.request_id
        if rid in self._routes:
            raise EngineError(f"request id {rid} is already in use")
        index = self._choose(request, avoid=None)
        if index is None:
            raise self.health().refusal()
        heard = retried = False

        def relay(event: OutputEvent) -> None:
            nonlocal heard, retried
            if (isinstance(event, Failed) and event.code in (OVERLOADED, UNAVAILABLE) and not heard and not retried
                    and rid not in self._aborted):
                other = self._choose(request, avoid=self._routes.get(rid))
                if other is not None:
                    retried = True
                    self._send(request, other, relay)
                    return
            heard = True
            if isinstance(event, (Finished, Failed)):
                self._routes.pop(rid, None)
                self._aborted.discard(rid)
            sink(event)

        self._send(request, index, relay)

    def abort(self, request_id: str) -> None:
        if (index := self._routes.get(request_id)) is not None:
            self._aborted.add(request_id)  # a refusal that crosses the abort is not tried again
            self.replicas[index].abort(request_id)

    def _choose(self, request: AdmittedRequest, avoid: int | None) -> int | None:
        serving = [i for i, replica in enumerate(self.replicas) if replica.serving and i != avoid]
        if not serving:
            return None
        index = self.affinity.replica_for(request)
        if index not in serving and request.conversation is not None:
            index = rendezvous(request.conversation, serving)
        if index not in serving:
            index = min(serving, key=lambda i: self.replicas[i].load)  # a tie: the first
        return index

    def _send(self, request: AdmittedRequest, index: int, relay: Sink) -> None:
        self.replicas[index].begin(request, relay)
        self._routes[request.request_id] = index
        self.affinity.keep(request, index)

    def stage_load(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for replica in self.replicas:
            for stage, n in replica.stage_load().items():
                total[stage] = total.get(stage, 0) + n
        return total

    def routed(self) -> dict[str, str]:
        return {rid: str(index) for rid, index in self._routes.items()}

    def health(self) -> EngineHealth:
        states = [replica.health() for replica in self.replicas]
        restarts = sum(state.restarts for state in states)
        unwell = [f"replica {i} {s.status}: {s.detail}" for i, s in enumerate(states) if s.status != "ok"]
        if not self.replicas:
            return EngineHealth("down", "no engine replica started")
        if all(state.status == "down" for state in states):
            retry_after_s = min(state.retry_after_s or 1.0 for state in states)
            return EngineHealth("down", "; ".join(unwell), restarts, retry_after_s)
        if unwell:
            return EngineHealth("degraded", "; ".join(unwell), restarts)
        return EngineHealth("ok", restarts=restarts, capacity=states[0].capacity)

