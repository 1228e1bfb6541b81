"""The engine pipe's ends: a message that cannot be read drops the connection (its reader hands over
`Closed`) rather than ending the reader unseen, and a portable connection carries a tensor in-band, as
a process that is not our parent's child (a Ray replica, another host) must read it, and on TCP with
Nagle's algorithm off."""

from __future__ import annotations

import asyncio
import os
import pickle
import socket
from multiprocessing import Pipe
from multiprocessing.connection import Client, Listener
from typing import Any

import torch

from engine.remote.messages import Closed
from engine.remote.pipe import portable, read_into


def _refuse() -> None:
    raise ValueError("this message cannot be read here")


class _Unreadable:
    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _refuse, ()


async def test_an_unreadable_message_drops_the_connection() -> None:
    ours, theirs = Pipe()
    loop = asyncio.get_running_loop()
    heard: asyncio.Queue[list[Any]] = asyncio.Queue()
    read_into(ours, loop, heard.put_nowait)
    theirs.send("hello")
    assert await asyncio.wait_for(heard.get(), 10) == ["hello"]
    theirs.send(_Unreadable())
    batch = await asyncio.wait_for(heard.get(), 10)
    assert isinstance(batch[-1], Closed), batch
    theirs.close()


def test_a_portable_connection_carries_a_tensor_in_band() -> None:
    ours, theirs = Pipe()
    ours, theirs = portable(ours), portable(theirs)
    features = torch.randn(128, 40)
    ours.send({"features": [features]})
    raw = theirs.recv_bytes()
    assert len(raw) > features.numel() * 4  # the values themselves, not a descriptor of shared memory
    assert torch.equal(pickle.loads(raw)["features"][0], features)
    ours.close()
    theirs.close()


async def test_a_portable_tcp_connection_sends_without_delay() -> None:
    with Listener(("127.0.0.1", 0), authkey=b"key") as listener:
        dialling = asyncio.create_task(asyncio.to_thread(Client, listener.address, authkey=b"key"))
        accepted = portable(await asyncio.to_thread(listener.accept))
        dialled = portable(await dialling)
    for conn in (dialled, accepted):
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    dialled.send("hello")
    assert accepted.recv() == "hello"
    dialled.close()
    accepted.close()
