"""Rows one stage hands another on a GPU: sent as soon as the sender's step is queued, read by the receiver's stream
only after the sender's stream has written them, on the GPU or into host memory (the GPU lane; skipped without
CUDA)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.stage import Stage

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="streams need a CUDA GPU")


def test_rows_sent_before_the_senders_step_is_done_are_read_after_it() -> None:
    sender, receiver = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.inference_mode():
        with torch.cuda.stream(sender):
            torch.cuda._sleep(100_000_000)  # the sender's step: tens of ms of GPU work before the rows are written
            rows = torch.full((1 << 20,), 7.0, device="cuda")
            written = Stage.written(SimpleNamespace(device=rows.device))  # type: ignore[arg-type]
        # the receiver takes them at once, as the Talker takes a prompt's rows while the Thinker's step still runs
        with torch.cuda.stream(receiver):
            Stage.adopt(rows, written)
            seen = rows * 1
        torch.cuda.synchronize()
    assert torch.equal(seen, torch.full_like(rows, 7.0))
    assert Stage.written(SimpleNamespace(device=torch.device("cpu"))) is None  # type: ignore[arg-type]


def test_host_rows_still_being_copied_there_are_read_after_the_copy() -> None:
    sender, receiver = torch.cuda.Stream(), torch.cuda.Stream()
    host = torch.empty(1 << 20, pin_memory=True)
    with torch.inference_mode():
        with torch.cuda.stream(sender):
            torch.cuda._sleep(100_000_000)
            host.copy_(torch.full((1 << 20,), 7.0, device="cuda"), non_blocking=True)  # a kept prefix's rows
            written = Stage.written(SimpleNamespace(device=torch.device("cuda")))  # type: ignore[arg-type]
        with torch.cuda.stream(receiver):
            Stage.adopt(host, written)
            seen = host.to("cuda", non_blocking=True) * 1  # the Talker copies back what its slot lacks
        torch.cuda.synchronize()
    assert torch.equal(seen, torch.full_like(seen, 7.0))
