import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.engine.stop import StopMatcher, StopStringError


def stream(matcher, deltas):
    """Feed deltas like a generator would: stop feeding once stopped, flush at the end."""
    out = []
    for d in deltas:
        emitted, stopped = matcher.feed(d)
        out.append(emitted)
        if stopped:
            return "".join(out), True
    out.append(matcher.flush())
    return "".join(out), False


def reference(text, stops):
    """Generation halts when the first stop string completes; that one's start is the cut."""
    for end in range(1, len(text) + 1):
        done = [s for s in stops if text[:end].endswith(s)]
        if done:
            return text[: end - len(max(done, key=len))], True
    return text, False


def test_stop_split_across_many_deltas():
    m = StopMatcher(("<end_of_turn>",))
    deltas = ["Hello", " world", "<", "end", "_of", "_", "turn", ">", "ignored"]
    emitted = []
    for d in deltas[:4]:
        text, stopped = m.feed(d)
        emitted.append(text)
        assert not stopped
    assert "".join(emitted) == "Hello world"  # "<" and "end" are held back
    assert m.feed("_of") == ("", False)
    assert m.feed("_") == ("", False)
    assert m.feed("turn") == ("", False)
    assert m.feed(">") == ("", True)
    assert m.stopped
    assert m.feed("ignored") == ("", True)
    assert m.flush() == ""


def test_text_before_stop_in_same_delta():
    m = StopMatcher(("###",))
    assert m.feed("answer: 42### more") == ("answer: 42", True)


def test_multiple_stops_earliest_wins():
    m = StopMatcher(("STOP", "END"))
    assert m.feed("abc END xyz STOP") == ("abc ", True)
    m = StopMatcher(("STOP", "END"))
    assert stream(m, list("one STOP two END")) == ("one ", True)


def test_overlapping_stops_first_to_complete_wins():
    # "bc" completes before "abcd" could, so generation would already have halted there.
    assert stream(StopMatcher(("abcd", "bc")), ["abcd"]) == ("a", True)
    assert stream(StopMatcher(("abcd", "bc")), list("abcd")) == ("a", True)
    # Both complete at the same character: the longer one (earlier start) wins.
    assert stream(StopMatcher(("cd", "abcd")), ["xabcd"]) == ("x", True)


def test_near_miss_prefix_is_released():
    m = StopMatcher(("</s>",))
    assert m.feed("a <") == ("a ", False)
    assert m.feed("/") == ("", False)
    assert m.feed("x") == ("</x", False)
    assert m.feed("</") == ("", False)
    assert m.flush() == "</"
    assert m.flush() == ""


def test_held_back_is_only_the_longest_live_prefix():
    m = StopMatcher(("aab",))
    assert m.feed("aaa") == ("a", False)  # "aa" could still become "aab"
    assert m.feed("b") == ("", True)  # "aaab"[:1] == "a" was already emitted


def test_empty_stops_pass_everything_through():
    m = StopMatcher(())
    assert m.feed("anything <") == ("anything <", False)
    assert m.flush() == ""


def test_unicode_stops():
    m = StopMatcher(("😀END", "ñ"))
    assert m.feed("héllo 😀") == ("héllo ", False)
    assert m.feed("EN") == ("", False)
    assert m.feed("Dx") == ("", True)
    m = StopMatcher(("😀END", "ñ"))
    assert stream(m, ["año"]) == ("a", True)


def test_duplicate_stops_are_fine():
    assert stream(StopMatcher(("x", "x")), ["abxc"]) == ("ab", True)


@pytest.mark.parametrize("stops", ["abc", ("ok", ""), (None,), [1]])
def test_invalid_stops(stops):
    with pytest.raises(StopStringError) as exc:
        StopMatcher(stops)
    assert isinstance(exc.value, ValueError)


@st.composite
def text_and_splits(draw, alphabet):
    text = draw(st.text(alphabet=alphabet, max_size=40))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=12)))
    bounds = [0, *cuts, len(text)]
    return text, [text[a:b] for a, b in zip(bounds, bounds[1:])]


ALPHABET = "ab<>é😀"
stop_strings = st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=5), max_size=4).map(tuple)


@settings(max_examples=400, deadline=None)
@given(text_and_splits(ALPHABET), stop_strings)
def test_property_emitted_text_is_independent_of_splitting(ts, stops):
    text, deltas = ts
    assert "".join(deltas) == text
    assert stream(StopMatcher(stops), deltas) == reference(text, stops)
    assert stream(StopMatcher(stops), [text]) == reference(text, stops)


@settings(max_examples=400, deadline=None)
@given(text_and_splits(ALPHABET), st.lists(st.text(alphabet=ALPHABET, min_size=1, max_size=5), min_size=1, max_size=4))
def test_property_text_before_first_occurrence(ts, stops):
    # When no stop string contains another, the cut is simply the first occurrence of any stop.
    stops = tuple(s for s in stops if not any(s != o and s in o for o in stops))
    text, deltas = ts
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    expected = text[: min(found)] if found else text
    emitted, stopped = stream(StopMatcher(stops), deltas)
    assert emitted == expected
    assert stopped == bool(found)


@settings(max_examples=200, deadline=None)
@given(text_and_splits(ALPHABET), stop_strings)
def test_property_never_emits_a_stop_string(ts, stops):
    text, deltas = ts
    m = StopMatcher(stops)
    emitted = ""
    for d in deltas:
        out, stopped = m.feed(d)
        emitted += out
        assert not any(s in emitted for s in stops)
        if stopped:
            break


def test_the_stop_word_is_the_one_that_completed_first():
    m = StopMatcher(("abc", "ab", "zz"))
    assert m.word is None
    assert stream(m, ["xa", "bc"]) == ("x", True) and m.word == "ab"  # "ab" completes before "abc"
    m = StopMatcher(("bcd", "abcde"))
    assert stream(m, ["abcd"]) == ("a", True) and m.word == "bcd"
    m = StopMatcher(("q",))
    assert stream(m, ["abc"]) == ("abc", False) and m.word is None
