"""espeak-ng phonemization as Piper does it: IPA per sentence, clause marks kept, nothing for nothing speakable."""

from __future__ import annotations

import pytest

from engine.cascade.phonemes import check_voice, phonemize


def test_phonemes_are_pipers() -> None:
    assert ["".join(s) for s in phonemize("Hello, how are you today?", "en-us")] == ["həlˈoʊ, hˌaʊ ɑːɹ juː tədˈeɪ?"]
    # one list per sentence, as Piper runs them; espeak-ng's own clause reader keeps "3.5" whole
    assert ["".join(s) for s in phonemize("It is 3.5 km. Is it far?", "en-us")] == [
        "ɪɾ ɪz θɹˈiː pɔɪnt fˈaɪv kˌeɪˈɛm.", "ɪz ɪt fˈɑːɹ?"]


@pytest.mark.parametrize("text", ["", "   \n", "...!?", "\U0001f642\U0001f389", "\u2014 * \u2014", "\u2764\ufe0f"])
def test_nothing_speakable_has_no_phonemes(text: str) -> None:
    assert phonemize(text, "en-us") == []


def test_an_unknown_espeak_voice_is_refused() -> None:
    check_voice("en-us")
    with pytest.raises(ValueError, match="espeak-ng has no voice 'xx-nowhere'"):
        check_voice("xx-nowhere")
