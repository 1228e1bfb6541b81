"""What a process built while it started (modules, the model's Python objects, graphs and compiled code) taken out
of Python's cyclic collector once it serves.

A full collection walks every object the collector tracks, holding the GIL throughout, so every stage thread and
the event loop stand still. One comes each time the survivors of younger collections reach a quarter of what the
process holds, which a server that keeps sessions and their history alive for hours makes. Frozen, start-up's
objects are never walked again; what serving makes is collected as before."""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_heap() -> None:
    """Collect start-up's garbage (a frozen cycle would never be freed), then freeze what is left."""
    gc.collect()
    gc.freeze()
    log.info("%d objects from start-up frozen out of the cyclic collector", gc.get_freeze_count())


def thaw_heap() -> None:
    """Frozen objects back to the collector: a process that starts another server (tests do) must free the last."""
    gc.unfreeze()
