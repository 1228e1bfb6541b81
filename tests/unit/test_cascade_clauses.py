"""The clause cutter: a short first clause, a few growing ones, whole sentences after them, numbers and abbreviations never split, and the
same clauses however the reply's text is split into deltas."""

from __future__ import annotations

import random

import pytest

from engine.cascade.clauses import ClauseCutter

REPLIES = [
    "Sure, I can help you with that. It will take a minute.",
    "I think we should probably go to the park today and maybe also the zoo if there is time left",
    "It costs 3.5 dollars. Mr. Smith, e.g. the U.S. team, agrees. Ok",
    "Here are the steps:\n1. Preheat the oven.\n2. Mix the flour, the eggs and the sugar in a bowl, then wait.",
    "So am I. Then we left at 10:30 p.m. and paid $1,000.50 for it! Really?\" she asked. \U0001f642",
    "Dr. J. K. Rowling wrote it... I loved it!!! Did you? Yes.",
]


def cut(text: str, cutter: ClauseCutter | None = None) -> list[str]:
    cutter = cutter or ClauseCutter()
    return cutter.feed(text) + cutter.flush()


def test_first_clause_ends_at_its_first_mark() -> None:
    cutter = ClauseCutter()
    assert cutter.feed("Sure, I can help you with that. It will take a minute.") == [
        "Sure,", "I can help you with that."]
    assert cutter.flush() == ["It will take a minute."]


def test_first_clause_without_a_mark_ends_after_five_words() -> None:
    cutter = ClauseCutter()
    assert cutter.feed("I think we should probably go to the park") == ["I think we should probably"]


@pytest.mark.parametrize(("text", "first"), [
    ("Well I went to the store and bought milk.", "Well I went to the store"),
    ("Yesterday I spoke with Mr. Smith about it.", "Yesterday I spoke with Mr. Smith"),
])
def test_first_clause_does_not_end_on_a_word_that_leans_on_the_next(text: str, first: str) -> None:
    assert cut(text)[0] == first


def test_later_clauses_end_at_sentences_and_at_commas_once_long() -> None:
    text = ("Hi. The train, which is late, leaves at nine. We could take the bus or the tram from the station, "
            "or walk there.")
    assert cut(text, ClauseCutter(ramp_words=())) == [
        "Hi.", "The train, which is late, leaves at nine.", "We could take the bus or the tram from the station,",
        "or walk there."]


def test_the_clauses_after_the_first_grow_before_whole_sentences() -> None:
    """The ramp: the second and third clauses end at their first mark or after 10 and 16 words, never on a word
    that leans on the next; from the fourth, sentences."""
    text = ("Paris is the capital and largest city of France and it lies on the river Seine in the north of the "
            "country where about two million people live today in its twenty districts. It is old. Very old, "
            "they say.")
    assert cut(text) == [
        "Paris is the capital and largest", "city of France and it lies on the river Seine",
        "in the north of the country where about two million people live today in its twenty", "districts.",
        "It is old.", "Very old, they say."]


def test_a_run_on_clause_ends_after_max_words() -> None:
    words = " ".join(f"W{i}" for i in range(60))
    assert [len(c.split()) for c in cut(f"Okay. {words}", ClauseCutter(ramp_words=()))] == [1, 25, 25, 10]
    assert [len(c.split()) for c in cut(f"Okay. {words}")] == [1, 10, 16, 25, 9]


@pytest.mark.parametrize(("text", "whole"), [
    ("It costs 3.5 dollars today, and 4.25 tomorrow.", ["3.5 dollars", "4.25 tomorrow"]),
    ("Okay. Then Mr. Smith and Dr. Jones met Prof. Lee.", ["Mr. Smith", "Dr. Jones", "Prof. Lee"]),
    ("Okay. Fruit, e.g. apples, i.e. red ones, from the U.S. are sweet.", ["e.g. apples", "i.e. red", "U.S. are"]),
    ("Yes. About 1,000 people came at 10:30 p.m. and stayed.", ["1,000 people", "10:30 p.m. and"]),
    ("Yes. The author J. K. Rowling wrote it.", ["J. K. Rowling"]),
])
def test_numbers_and_abbreviations_are_never_cut(text: str, whole: list[str]) -> None:
    clauses = cut(text)
    assert " ".join(clauses) == text
    for piece in whole:
        assert any(piece in c for c in clauses), (piece, clauses)


def test_a_list_number_stays_with_its_item_and_a_line_break_ends_a_clause() -> None:
    assert cut("Steps:\n1. Heat the oven\n2. Mix.") == ["Steps:", "1. Heat the oven", "2. Mix."]


def test_flush_returns_the_tail_and_starts_a_new_reply() -> None:
    cutter = ClauseCutter()
    assert cutter.feed("Okay. See you") == ["Okay."]
    assert cutter.flush() == ["See you"]
    assert cutter.flush() == []
    assert cutter.feed("Right, the next reply starts short") == ["Right,"]  # a first clause again
    assert cutter.flush() == ["the next reply starts short"]
    assert cut("Bye! \U0001f44b \u2014") == ["Bye!"]  # a tail with no letter is nothing to speak
    assert cut("   ") == []


@pytest.mark.parametrize("reply", REPLIES)
def test_deltas_of_any_size_give_the_clauses_of_the_whole_text(reply: str) -> None:
    expected = cut(reply)
    rng = random.Random(0)
    splits = [[1] * len(reply), [2] * len(reply), [7] * len(reply), [rng.randint(1, 9) for _ in reply]]
    for sizes in splits:
        cutter, clauses, at = ClauseCutter(), [], 0
        for size in sizes:
            clauses += cutter.feed(reply[at : at + size])
            at += size
        assert clauses + cutter.flush() == expected, sizes[:3]


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="first_words"):
        ClauseCutter(first_words=0)
    with pytest.raises(ValueError, match="first_words"):
        ClauseCutter(first_words=30, max_words=25)
    with pytest.raises(ValueError, match="ramp_words"):
        ClauseCutter(ramp_words=(10, 40))
