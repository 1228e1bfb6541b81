"""Payloads for a stage with several copies: least in flight first, then sticky, until the last payload."""

from __future__ import annotations

from engine.handoff import CodecFrames, Inbox, StickyRouter, ThinkerDone, ThinkerToken


def _token(request_id: str) -> ThinkerToken:
    return ThinkerToken(request_id, 1, embed=None)  # type: ignore[arg-type]


def test_requests_spread_then_stick_until_their_last_payload() -> None:
    inboxes = [Inbox(), Inbox()]
    router = StickyRouter(inboxes, is_last=lambda item: isinstance(item, ThinkerDone))
    for rid in ("a", "b", "c"):
        router.put(_token(rid))
    assert router.in_flight == [2, 1]  # a -> 0, b -> 1, c -> 0
    router.put(_token("b"))
    router.put(ThinkerDone("a"))  # a's last payload still goes to its replica, then frees it
    assert router.in_flight == [1, 1]
    router.put(_token("d"))  # a tie: the first replica
    got = [[(type(i).__name__, i.request_id) for i in box.drain(None)] for box in inboxes]
    assert got == [
        [("ThinkerToken", "a"), ("ThinkerToken", "c"), ("ThinkerDone", "a"), ("ThinkerToken", "d")],
        [("ThinkerToken", "b"), ("ThinkerToken", "b")],
    ]


def test_a_forgotten_request_frees_its_replica() -> None:
    router = StickyRouter([Inbox(), Inbox()], is_last=lambda item: item.is_final)
    router.put(CodecFrames("x", frames=None, is_final=False))  # type: ignore[arg-type]
    router.forget("x")  # aborted: no final payload will come
    router.forget("x")  # twice is harmless
    router.put(CodecFrames("x", frames=None, is_final=False))  # sent before the sender saw the abort
    assert router.in_flight == [0, 0]
    assert all(box.qsize() == 0 for box in router.inboxes[1:]) and router.inboxes[0].qsize() == 1


def test_an_aborted_reply_frees_its_copies_in_the_engine(cache_dir) -> None:
    import asyncio

    from engine import AudioChunk, EngineRequest, Message, SamplingParams, TextPart, create_engine
    from engine.profile import load_profile

    async def run() -> list[list[int]]:
        profile = load_profile(model="tiny", platform="cpu",
                               stage_overrides={"talker": {"copies": 2}, "code2wav": {"copies": 2}})
        engine = create_engine("tiny", profile, cache_dir)
        await engine.start()
        try:
            request = EngineRequest("r", (Message("user", (TextPart("hello"),)),), True, "ethan",
                                    SamplingParams(max_tokens=50))
            stream = await engine.submit(request)
            async for event in stream:
                if isinstance(event, AudioChunk):  # both routers have placed the reply by now
                    engine.abort("r")
            return [router.in_flight for router in engine.core.core.routers]
        finally:
            await engine.stop()

    assert asyncio.run(run()) == [[0, 0], [0, 0]]
