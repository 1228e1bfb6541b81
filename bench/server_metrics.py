"""What a bench level reads from the server's own /metrics: its latency histograms' sums and counts before and
after, and each stage's steps in between (which stage held the GPU)."""

from __future__ import annotations

from collections.abc import Iterable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.stats import StageSteps

STEP_HISTOGRAM = "engine_stage_step_seconds"
FIRST_PACKET_PART = "engine_first_packet_part_seconds"
VISION_TOWER = "engine_vision_tower_seconds"  # a step's pictures through the vision tower
CROSSING = "engine_request_crossing_seconds"  # a request's way from a server process to an engine's process
IMAGE_DECODE = "gateway_image_decode_seconds"  # a picture's bytes to its pixels in the server
_LATENCY_HISTOGRAMS = ("engine_ttft_seconds", "engine_ttfp_seconds", "gateway_chat_ttft_seconds",
                       "gateway_chat_ttfp_seconds", STEP_HISTOGRAM, FIRST_PACKET_PART, VISION_TOWER, CROSSING,
                       IMAGE_DECODE)


async def server_latency_sums(client: httpx.AsyncClient,
                              names: Iterable[str] = _LATENCY_HISTOGRAMS) -> dict[str, tuple[float, float]]:
    """(sum, count) of the server's latency histograms `names` from its /metrics (by default TTFT and TTFP:
    the engine's, from submit, and the gateway's, from the request's arrival, and every stage's steps), keyed
    by name, and `name{label=value,...}` for a labelled series; empty when it has none."""
    names = set(names)
    try:
        resp = await client.get("/metrics")
        resp.raise_for_status()
        families = list(text_string_to_metric_families(resp.text))
    except (httpx.HTTPError, ValueError):
        return {}
    sums: dict[str, list[float]] = {}
    for family in families:
        if family.name not in names:
            continue
        for sample in family.samples:
            part = sample.name.removeprefix(family.name)
            if part in ("_sum", "_count"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                pair = sums.setdefault(f"{family.name}{{{labels}}}" if labels else family.name, [0.0, 0.0])
                pair[part == "_count"] = sample.value
    return {key: (total, count) for key, (total, count) in sums.items()}


def count_between(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], name: str) -> int:
    """How many observations `name` gained between two of `server_latency_sums`' readings."""
    return round(after.get(name, (0.0, 0.0))[1] - before.get(name, (0.0, 0.0))[1])


def first_packet_parts(means: dict[str, float]) -> dict[str, float]:
    """Each part of the engine's first packet, from means keyed as `server_latency_sums` keys them."""
    prefix = f"{FIRST_PACKET_PART}{{part="
    return {key[len(prefix):-1]: mean for key, mean in means.items() if key.startswith(prefix)}


def step_shares(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]],
                wall_s: float) -> dict[str, StageSteps]:
    """Each stage's and phase's steps over a level, from its /metrics before and after (`server_latency_sums`)."""
    shares: dict[str, StageSteps] = {}
    for key, (total, count) in after.items():
        if not key.startswith(f"{STEP_HISTOGRAM}{{"):
            continue
        total_before, count_before = before.get(key, (0.0, 0.0))
        if (steps := count - count_before) > 0:
            spent = total - total_before
            labels = dict(item.split("=", 1) for item in key[len(STEP_HISTOGRAM) + 1 : -1].split(","))
            shares[f"{labels.get('stage')}/{labels.get('phase')}"] = StageSteps(
                int(steps), 1000 * spent / steps, spent / wall_s if wall_s > 0 else 0.0)
    return dict(sorted(shares.items()))
