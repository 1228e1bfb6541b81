"""Host ICE candidates on configured addresses only, for WebRTC calls (aiortc 1.16 / aioice 0.13 internals).

aioice gathers host candidates on every interface address except 127.0.0.1 (`aioice.ice.get_host_addresses`),
and neither aiortc's `RTCConfiguration` nor aioice's `Connection` takes a list of addresses: the only public
lever is that module function, a process-wide global. A deployment that must stay on given addresses, and our
tests, which run each call in a network namespace with nothing but loopback, need per-call addresses. So this
module reaches past the public API: it takes each transport's `RTCIceGatherer._connection` (aiortc private),
gathers with `Connection.get_component_candidates(addresses=...)` (public), and marks the connection as
gathered through `_local_candidates_start` / `_end` and `_components` (aioice private), so that aiortc's own
`gather()` that `setLocalDescription` runs next finds the work done. Written against aiortc 1.16.0 and aioice
0.13.0; re-check these four names on an upgrade (tests/integration/test_webrtc.py fails without them).
"""

from __future__ import annotations

from aiortc import RTCPeerConnection


async def gather_on(pc: RTCPeerConnection, addresses: tuple[str, ...]) -> None:
    """Gather host candidates on exactly `addresses` for every transport of `pc`; call before setLocalDescription."""
    gatherers = {t.sender.transport.transport.iceGatherer for t in pc.getTransceivers() if t.sender.transport}
    if pc.sctp is not None:
        gatherers.add(pc.sctp.transport.transport.iceGatherer)
    for gatherer in gatherers:
        connection = gatherer._connection
        if connection._local_candidates_start:
            continue
        connection._local_candidates_start = True
        for component in connection._components:
            connection._local_candidates += await connection.get_component_candidates(
                component=component, addresses=list(addresses)
            )
        connection._local_candidates_end = True
