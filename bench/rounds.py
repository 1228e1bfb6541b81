"""Rounds of a ladder: every row measured again, round after round, and what the rounds say together.

On a shared machine one run of a row can differ from the next by more than the rows differ from each
other. Rows run in turn within each round, so slow drift falls on every row alike, and each row's mean
TTFP is paired with the first row's of the same round: the spread of those differences, not of the
rows' own figures, is what a claim about a row's cost rests on. Each round starts one row later
(`round_order`), so a host that is slower late in a round than early (turbo spent, a neighbour's load)
favours no row over a multiple of the rows' count of rounds.

Round 1 writes DIR/<row>.json (what the figures show); round K > 1 writes DIR/round-K/<row>.json.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


def round_dir(out_dir: Path, k: int) -> Path:
    """Where round `k` (from 1) writes its rows' JSONs and logs."""
    return out_dir if k == 1 else out_dir / f"round-{k}"


@dataclass(frozen=True)
class Spread:
    """Values of one figure over the rounds; stdev and stderr need two of them."""

    n: int
    mean: float
    stdev: float | None
    stderr: float | None  # of the mean: a 20 ms claim needs this well under 20 ms
    min: float
    max: float

    @classmethod
    def of(cls, values: list[float]) -> Spread | None:
        if not values:
            return None
        stdev = statistics.stdev(values) if len(values) > 1 else None
        return cls(len(values), statistics.fmean(values), stdev,
                   None if stdev is None else stdev / math.sqrt(len(values)), min(values), max(values))


def round_order(count: int, k: int) -> list[int]:
    """The order `count` rows run in round `k` (from 1), as indexes into the ladder's."""
    start = (k - 1) % count
    return [*range(start, count), *range(start)]


Levels = dict[tuple[int, int], float]  # (prompt words, concurrency) -> mean TTFP


def _ttfp_by_level(row: dict[str, Any]) -> Levels:
    if row.get("status") != "ok":
        return {}
    return {(lv["prompt_words"], lv["concurrency"]): lv["ttfp_s"]["mean"]
            for lv in row["levels"] if lv["ttfp_s"]["mean"] is not None}


def summarize_rounds(rounds: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """ladder.json's `rounds`: `rounds[k]` is round k+1's row summaries, in the ladder's order.

    For each row and level: its mean TTFP in each round (None where that round's row failed), their
    spread, and the spread of its difference from the first row's in the same round. For each row: the
    place it ran at in each round, and the CPU seconds its server's processes spent over a sweep, their
    spread over the rounds and their mean by process."""
    names = [row["name"] for row in rounds[0]]
    reference = names[0]
    by_round = [{row["name"]: _ttfp_by_level(row) for row in rnd} for rnd in rounds]
    rows = []
    for name in names:
        levels = sorted({key for rnd in by_round for key in rnd.get(name, {})})
        out = []
        for key in levels:
            ttfp = [rnd.get(name, {}).get(key) for rnd in by_round]
            ref = [rnd.get(reference, {}).get(key) for rnd in by_round]
            paired = [None if t is None or r is None else t - r for t, r in zip(ttfp, ref, strict=True)]
            own = Spread.of([t for t in ttfp if t is not None])
            diff = Spread.of([d for d in paired if d is not None]) if name != reference else None
            out.append({"prompt_words": key[0], "concurrency": key[1], "ttfp_mean_s_by_round": ttfp,
                        "minus_reference_s_by_round": paired if name != reference else None,
                        "ttfp_mean_s": None if own is None else asdict(own),
                        "minus_reference_s": None if diff is None else asdict(diff)})
        sweeps = [row["cpu_s"] for rnd in rounds for row in rnd if row["name"] == name and row.get("cpu_s")]
        places = [next((row.get("place") for row in rnd if row["name"] == name), None) for rnd in rounds]
        rows.append({"name": name, "place_by_round": places, "levels": out, "cpu_s": _cpu(sweeps)})
    return {"count": len(rounds), "reference": reference, "rows": rows}


def _cpu(sweeps: list[dict[str, float]]) -> dict[str, Any] | None:
    if not sweeps:
        return None
    total = Spread.of([sum(sweep.values()) for sweep in sweeps])
    names = sorted({name for sweep in sweeps for name in sweep}, key=lambda n: -sum(s.get(n, 0.0) for s in sweeps))
    return {"total": asdict(total) if total else None,
            "by_process_mean": {n: round(statistics.fmean(s.get(n, 0.0) for s in sweeps), 2) for n in names}}
