"""Host ICE candidates on configured addresses only, for WebRTC calls (aiortc 1.16 / aioice 0.13 internals).

aioice gathers host candidates on every interface address but 127.0.0.1, and the only public lever is a
process-wide module function; deployments that must stay on given addresses, and our tests (each call in a
network namespace with loopback only), need per-call addresses. So this module takes each transport's
`RTCIceGatherer._connection` (aiortc private), gathers with `Connection.get_component_candidates(addresses=...)`,
and marks the connection gathered through `_local_candidates_start` / `_end` and `_components` (aioice private),
so that the `gather()` `setLocalDescription` runs finds the work done. Re-check these four names on an upgrade
(tests/integration/test_webrtc.py fails without them)."""

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
