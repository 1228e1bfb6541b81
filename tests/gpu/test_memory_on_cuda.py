"""The memory plan on a GPU: the GPU profile as it ships, on a card capped at 48 GiB (the L40S / A6000 class, by
`memory.card_gib`), starts with FP8 experts and narrowed Code2Wav steps, serves 16 spoken replies at once to their
end, refuses what its pools cannot hold with a 429 and never an error, and the card holds no more than the plan's
share of it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch

from tests.conftest import Server, start_server, stop_server

CARD_GIB = 48
# dummy weights and the bench's reply lengths (40 tokens, 10 s of speech): nothing else differs from the profile
OVERRIDES = {"load_format": "dummy", "memory": {"card_gib": CARD_GIB},
             "stages": {"thinker": {"default_max_tokens": 40, "ignore_eos": True},
                        "talker": {"max_frames": 125, "ignore_eos": True}}}


@pytest.fixture(scope="module")
def capped(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("capped") / "server.log"
    proc, server = start_server(cache_dir, log, "--overrides", json.dumps(OVERRIDES), model="dummy", ready_s=420)
    yield server
    stop_server(proc)


def test_the_capped_card_holds_what_the_plan_says(capped: Server) -> None:
    health = capped.get("/health").json()
    line = health["capacity"]
    assert f"{CARD_GIB:.1f} GiB (capped)" in line and "FP8 experts" in line and "Code2Wav's steps 100 frames" in line
    free, total = torch.cuda.mem_get_info()
    used_gib = (total - free) / 2**30
    # 90 % of the capped card, and this test process's own CUDA context (~0.5 GiB)
    assert used_gib <= 0.9 * CARD_GIB + 1.0, (used_gib, line)


def _chat(max_tokens: int, audio: bool) -> dict:
    body = {"model": "dummy", "messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": max_tokens, "stream": True}
    if audio:
        body |= {"modalities": ["text", "audio"], "audio": {"voice": "ethan", "format": "pcm16"}}
    return body


async def _spoken(http: httpx.AsyncClient, server: Server) -> tuple[int, bool]:
    """A spoken reply read to its end: its status, and whether it ended without an error."""
    async with http.stream("POST", server.base_url + "/v1/chat/completions", json=_chat(40, True)) as response:
        lines = [line async for line in response.aiter_lines() if line]
    return response.status_code, lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines)


async def _status(http: httpx.AsyncClient, server: Server, max_tokens: int) -> tuple[int, str | None]:
    """A long text reply's status (left after its first line), and its Retry-After."""
    async with http.stream("POST", server.base_url + "/v1/chat/completions", json=_chat(max_tokens, False)) as response:
        if response.status_code == 200:
            await anext(aiter(response.aiter_lines()))
        return response.status_code, response.headers.get("retry-after")


def test_sixteen_spoken_replies_at_once_end_and_what_the_pools_cannot_hold_is_a_429(capped: Server) -> None:
    async def run() -> tuple[list, list]:
        async with httpx.AsyncClient(timeout=300) as http:
            spoken = await asyncio.gather(*(_spoken(http, capped) for _ in range(16)))
            # replies that may run to 3,000 tokens reserve 3,072 positions each: a handful fit the 48 GiB card's pools
            long = await asyncio.gather(*(_status(http, capped, 3000) for _ in range(64)))
        return spoken, long

    spoken, long = asyncio.run(run())
    assert spoken == [(200, True)] * 16
    statuses = [status for status, _ in long]
    assert set(statuses) == {200, 429}, statuses
    assert all(retry_after and int(retry_after) >= 1 for status, retry_after in long if status == 429)
    assert "out of memory" not in capped.log().lower() and "Traceback" not in capped.log()
