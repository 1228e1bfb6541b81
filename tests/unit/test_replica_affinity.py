"""Which replica a conversation's next turn goes to (engine/replicas/affinity.py), and the profile's
`replicas:` section; neither needs Ray."""

from __future__ import annotations

import pytest

from engine import ProfileError, load_profile
from engine.handoff import AdmittedRequest
from engine.replicas.affinity import ConversationAffinity, rendezvous


def _request(ids: list[int], audio_keys: tuple[int, ...] = ()) -> AdmittedRequest:
    return AdmittedRequest("r", ids, [], 0, list(audio_keys), False, "ethan", 4, 0.7, 0.8, 20, None)


def test_a_turn_goes_where_the_longest_prompt_it_begins_with_ran() -> None:
    affinity = ConversationAffinity()
    affinity.keep(_request([1, 2, 3]), replica=0)
    affinity.keep(_request([1, 2, 3, 4, 5]), replica=1)
    assert affinity.replica_for(_request([1, 2, 3, 4, 5, 6])) == 1
    assert affinity.replica_for(_request([1, 2, 3, 9])) == 0
    # a shared beginning that covers no whole kept prompt, or the same prompt again: no affinity
    assert affinity.replica_for(_request([1, 2, 7, 8])) is None
    assert affinity.replica_for(_request([1, 2, 3])) is None


def test_other_audio_under_the_same_placeholders_does_not_match() -> None:
    affinity = ConversationAffinity()
    affinity.keep(_request([1, 5, 5, 2], audio_keys=(-11,)), replica=1)
    assert affinity.replica_for(_request([1, 5, 5, 2, 3], audio_keys=(-11, -12))) == 1
    assert affinity.replica_for(_request([1, 5, 5, 2, 3], audio_keys=(-13,))) is None


def test_the_oldest_prompts_are_forgotten_first() -> None:
    affinity = ConversationAffinity(capacity=2)
    for replica, ids in enumerate(([1], [1, 2], [1, 2, 3])):
        affinity.keep(_request(ids), replica)
    assert len(affinity) == 2
    assert affinity.replica_for(_request([1, 9])) is None
    assert affinity.replica_for(_request([1, 2, 9])) == 1


def test_a_named_conversation_goes_to_one_replica_from_every_process() -> None:
    """Rendezvous hashing: the pick is a function of the name and the serving replicas alone (so every
    server process makes it alike), spreads names evenly, and a replica that leaves moves only its own."""
    names = [f"conversation-{i}" for i in range(3000)]
    picks = {name: rendezvous(name, [0, 1, 2, 3]) for name in names}
    assert all(rendezvous(name, [0, 1, 2, 3]) == pick for name, pick in picks.items())
    counts = [list(picks.values()).count(r) for r in range(4)]
    assert min(counts) > 0.8 * len(names) / 4, counts
    without_two = {name: rendezvous(name, [0, 1, 3]) for name in names}
    moved = [name for name in names if without_two[name] != picks[name]]
    assert moved and all(picks[name] == 2 for name in moved)


def test_the_replicas_section_is_checked() -> None:
    profile = load_profile(model="tiny", platform="cpu",
                           overrides={"engine": {"where": "ray", "replicas": {"count": 2, "address": "auto"}}})
    replicas = profile.engine.replicas
    assert replicas.count == 2 and replicas.address == "auto" and not profile.runs_in_process
    assert load_profile(model="tiny", platform="cpu").engine.where == "in_process"
    with pytest.raises(ProfileError, match=r"engine\.replicas\.count: must be >= 1"):
        load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "ray", "replicas": {"count": 0}}})
    with pytest.raises(ProfileError, match=r"engine\.replicas\.gpu: unknown key"):
        load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "ray", "replicas": {"gpu": 1}}})
    with pytest.raises(ProfileError, match=r"engine\.replicas: only with engine\.where: ray"):
        load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "process", "replicas": {"count": 2}}})
    # the server processes of --http-workers share the replicas
    shared = load_profile(model="tiny", platform="cpu", overrides={"engine": {"where": "ray", "http_workers": 2}})
    assert shared.engine.http_workers == 2
