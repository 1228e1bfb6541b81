"""The kept prefixes' index (engine/omni/runners/kept_slots.py): a prompt's candidates are the prefixes that share
the most of its whole blocks, and the longest match among them is the longest among all kept prefixes, found
by comparing each only past the blocks they share."""

from __future__ import annotations

import numpy as np

from engine.omni.runners.kept_slots import Match, PrefixIndex


def common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    same = a[:n] == b[:n]
    return n if same.all() else int(np.argmin(same))


def test_the_candidates_hold_the_most_whole_blocks() -> None:
    index: PrefixIndex[str] = PrefixIndex(4)
    system = np.arange(8)
    index.add("short", np.arange(3))  # not one whole block: never a candidate
    index.add("system", system)
    index.add("user-a", np.concatenate([system, [50, 51, 52, 53, 54]]))
    index.add("user-b", np.concatenate([system, [60, 61, 62, 63]]))
    assert sorted(index.candidates(np.concatenate([system, [50, 51, 52, 53, 99]]))) == ["user-a"]
    # a prompt that parts inside its third block: everything that holds its first two
    assert sorted(index.candidates(np.concatenate([system, [70, 71]]))) == ["system", "user-a", "user-b"]
    assert index.candidates(np.arange(3)) == [] and index.candidates(np.array([9, 9, 9, 9, 9])) == []
    assert sorted(index.candidates(system, lambda name: name != "system")) == ["user-a", "user-b"]
    index.remove("user-a")
    assert sorted(index.candidates(np.concatenate([system, [50, 51, 52, 53]]))) == ["system", "user-b"]
    assert index._holders and all(index._holders.values())  # no empty sets left behind


def test_the_longest_match_is_among_the_candidates() -> None:
    rng = np.random.default_rng(0)
    block = 8
    index: PrefixIndex[int] = PrefixIndex(block)
    stems = [rng.integers(0, 5, 40) for _ in range(3)]  # few ids: prompts part at any position
    kept = {}
    for name in range(60):
        stem = stems[name % 3][: rng.integers(0, 40)]
        kept[name] = np.concatenate([stem, rng.integers(0, 5, rng.integers(0, 30))])
        index.add(name, kept[name])
    for _ in range(200):
        stem = stems[rng.integers(0, 3)][: rng.integers(0, 40)]
        prompt = np.concatenate([stem, rng.integers(0, 5, rng.integers(0, 30))])
        best = max(common(k, prompt) for k in kept.values())
        found = max((common(kept[n], prompt) for n in index.candidates(prompt)), default=0)
        assert found == best or best < block, (best, found)
        match = index.longest(prompt, kept.__getitem__)
        assert (match.length if match else 0) == found
        assert match is None or common(kept[match.name], prompt) == match.length


def test_a_digest_collision_shortens_a_match_and_never_makes_a_wrong_one() -> None:
    index: PrefixIndex[str] = PrefixIndex(4)
    system = np.arange(12)
    index.add("a", system)
    # what "a" really holds parts from the prompt at position 2, though its digests say 12 (as a collision would)
    held = {"a": np.array([0, 1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7])}
    assert index.longest(system, held.__getitem__) == Match("a", 2)
    held["a"] = system
    assert index.longest(np.concatenate([system, [5]]), held.__getitem__) == Match("a", 12)
    assert index.longest(np.array([9, 9, 9, 9]), held.__getitem__) is None
