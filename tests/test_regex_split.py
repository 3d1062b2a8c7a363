"""The pre-tokenizers' regexes compiled for numba (engine/regex_split.py) split every text into the
very pieces Oniguruma's Split steps give, for every pre-tokenizer type llama.cpp knows."""
from __future__ import annotations

import random

import numpy as np
import pytest
from tokenizers import Regex, pre_tokenizers

from helpers.vocab_gguf import random_texts
from infer.engine.pieces import gather_ids, unique_pieces
from infer.engine.pretokenizers import DIGIT_GROUPS, PRE_TOKENIZERS, onig_regex
from infer.engine.regex_split import SplitChain, Unsupported

REGEXES = {p.type: p.regexes for p in PRE_TOKENIZERS.values()}  # every pre-tokenizer type llama.cpp has
# what stays with Oniguruma: a regex that can match the empty string (SUPERBPE's lookahead-only split)
ONIG_ONLY = {"SUPERBPE"}
EXTRA = ["'s", "'LL", "'re ", "IMGIMGABZ", "<sentinel:12>", "    ", "\t\n", "1234567", " 12,345.6", "µÀ",
         "\u3000", "a\u0301", "한국어", "ｶﾀｶﾅ", "!?…。，", "$+<=>^~|`", "\r\n\r\n", " \n ", "x" * 300, " " * 40]


def _onig_pieces(regexes: list[str], text: str) -> list[str]:
    steps = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
    return [p for p, _ in steps.pre_tokenize_str(text)]


@pytest.mark.parametrize("kind", sorted(REGEXES))
def test_pieces_match_oniguruma(kind):
    regexes = [onig_regex(r) for r in REGEXES[kind]]
    if DIGIT_GROUPS in regexes:
        pytest.skip("llama.cpp's digit grouping is a matcher of its own (pretokenizers.split_digit_groups)")
    if kind in ONIG_ONLY:
        with pytest.raises(Unsupported):
            SplitChain(regexes)
        return
    chain = SplitChain(regexes)
    rng = random.Random(kind)
    texts = random_texts(len(kind), 120, EXTRA) + ["".join(rng.choice(EXTRA) for _ in range(50)) for _ in range(20)]
    for text in texts:
        _, starts, ends = chain.pieces(text)
        ours = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
        assert ours == _onig_pieces(regexes, text), text


def test_a_lone_surrogate_is_left_to_the_caller():
    with pytest.raises(UnicodeEncodeError):
        SplitChain([onig_regex(REGEXES["GPT2"][0])]).pieces("a\ud800b")


def test_repeated_pieces_are_found_and_their_ids_gathered():
    text = "the cat, the dog, the cat"
    chain = SplitChain([onig_regex(REGEXES["GPT2"][0])])
    cps, starts, ends = chain.pieces(text)
    pieces = [text[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    first = unique_pieces(cps, starts, ends)
    assert [pieces.index(p) for p in pieces] == first.tolist()
    uniq = np.flatnonzero(first == np.arange(len(first)))
    uniq_of = np.full(len(first), -1, np.int64)
    uniq_of[uniq] = np.arange(len(uniq))
    ids = np.arange(2 * len(uniq), dtype=np.int32)  # two ids per distinct piece
    offsets = np.arange(0, 2 * len(uniq) + 1, 2, dtype=np.int64)
    got, where = gather_ids(first, uniq_of, ids, offsets)
    assert got.tolist() == [i for p in pieces for i in (2 * uniq_of[pieces.index(p)], 2 * uniq_of[pieces.index(p)] + 1)]
    assert where.tolist() == list(range(0, 2 * len(pieces) + 1, 2))
