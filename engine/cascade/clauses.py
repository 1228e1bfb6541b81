"""Cuts a reply's streamed text into clauses to speak: a short first one, so that the first audio comes early, a
few that grow after it, so that each is made while the one before plays, then whole sentences; owns the text not
yet cut.

A cut falls only after a whole word, once the next word's first character is seen: "3.5", "1,000" and "10:30" have no
space after their marks, and that character tells a sentence's end from an abbreviation's dot ("e.g. this", "U.S. law":
a dot before a lower-case letter ends nothing, as in espeak-ng's clause reader). Every decision reads only the text
up to that character, so the clauses are the same however the text is split into deltas.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_WORD = re.compile(r"\S+")
_CLOSERS = "\"')]}\u00bb\u201d\u2019"  # after a mark: `"Really?" she said` ends at the quote
_INITIALS = re.compile(r"[A-Za-z](\.[A-Za-z])*\.")  # "J.", "e.g.", "U.S.A.", "p.m."
# a dot after these never ends a sentence: a title before a name, or an abbreviation in running text
_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "mt", "vs", "approx", "fig"})
# a first clause cut by its word count does not end on a word that leans on the next one ("I went to the | store")
_LEANS_ON_NEXT = frozenset({
    "a", "an", "the", "to", "of", "in", "on", "at", "for", "with", "from", "by", "about", "and", "or", "but", "so",
    "if", "as", "than", "my", "your", "his", "her", "its", "our", "their", "this", "that", "these", "those", "is",
    "are", "was", "were", "be", "am", "i", "you", "we", "they", "it", "not", "very", "some", "any", "no", "can",
    "will", "would", "should", "could", "do", "does", "did", "have", "has", "had",
})


@dataclass(slots=True)
class ClauseCutter:
    """Owns the reply's text that is not a clause yet: `feed(delta)` returns the clauses that delta completes, `flush()`
    the rest at the reply's end. The first clause ends at its first mark (, ; : . ? !) or after `first_words` words,
    the ramp's after `ramp_words` (up to 3 more while the last word leans on the next: "the", "Mr."), later ones at a
    sentence's end or a line break, at a comma once `comma_words` long, after `max_words` at the latest. A clause
    holds a letter: "1." of a list stays with its item, text with none (emoji) is dropped. The ramp serves a shared
    CPU, where a whole sentence after a short first clause takes longer to make than that clause plays."""

    first_words: int = 5
    ramp_words: tuple[int, ...] = (10, 16)
    comma_words: int = 8
    max_words: int = 25
    _pending: str = field(default="", init=False)
    _cut: int = field(default=0, init=False)  # clauses of this reply cut so far

    def __post_init__(self) -> None:
        limits = (self.first_words, *self.ramp_words)
        if not all(1 <= n <= self.max_words for n in limits) or not 1 <= self.comma_words:
            raise ValueError(f"need 1 <= first_words, ramp_words <= max_words and comma_words >= 1: {self}")

    def feed(self, delta: str) -> list[str]:
        self._pending += delta
        clauses = []
        while (cut := self._next_cut()) is not None:
            end, resume = cut
            clauses.append(self._pending[:end].strip())
            self._pending = self._pending[resume:]
            self._cut += 1
        return clauses

    def flush(self) -> list[str]:
        rest = self._pending.strip()
        self._pending, self._cut = "", 0
        return [rest] if any(c.isalpha() for c in rest) else []

    def _next_cut(self) -> tuple[int, int] | None:
        """(end of the clause, start of the text after it), or None until a cut can be decided."""
        text = self._pending
        words = 0
        has_letter = False
        for match in _WORD.finditer(text):
            following = _WORD.search(text, match.end())
            if following is None:
                return None  # the word may go on, or what follows it is not seen yet
            word, gap, next_char = match.group(), text[match.end() : following.start()], following.group()[0]
            words += 1
            has_letter = has_letter or any(c.isalpha() for c in word)
            if has_letter and self._ends_clause(word, words, "\n" in gap, next_char):
                return match.end(), following.start()
        return None

    def _ends_clause(self, word: str, words: int, line_break: bool, next_char: str) -> bool:
        bare = word.rstrip(_CLOSERS)
        mark = bare[-1] if bare and bare[-1] in ".?!,;:" else ""
        abbreviation = mark == "." and bare != "I." and (
            bare[:-1].lower() in _ABBREVIATIONS or _INITIALS.fullmatch(bare) is not None)
        if line_break or mark in ("?", "!") or (mark == "." and not abbreviation and not next_char.islower()):
            return True
        ramping = self._cut <= len(self.ramp_words)
        if mark in (",", ";", ":"):
            return ramping or words >= self.comma_words
        if ramping:
            limit = (self.first_words, *self.ramp_words)[self._cut]
            if words >= limit:
                leans = abbreviation or word.strip(_CLOSERS + ".,;:").lower() in _LEANS_ON_NEXT
                return not leans or words >= limit + 3
            return False
        return words >= self.max_words
