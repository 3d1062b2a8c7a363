"""RWKV 'world' vocabulary ('rwkv' GGUF vocab), reproducing llama.cpp's RWKV tokenizer.

RWKV tokens are arbitrary byte strings (many are partial UTF-8 sequences), but a GGUF token
list holds text, so the converter stores each token as Python's bytes repr without the quotes
(b'\\xe4\\xbd' -> '\\xe4\\xbd'). llama.cpp unescapes every token once, puts all of them (whatever
their type: '<s>', '[PAD..]' padding and all) into a byte trie and takes the longest match at
each position, greedily, left to right. There are no merges, scores or space prefix.
"""
from __future__ import annotations

import codecs
import re
from types import MappingProxyType

from infer.engine.special_tokens import CONTROL, UNKNOWN
from infer.engine.tokenizer_error import TokenizerError

_BACKSLASH = 0x5C
# Texts whose every escape reads the same in Python and in llama_unescape_rwkv_token.
_PYTHON_ESCAPES = re.compile(rb'(?:[^\\]|\\[tnr\\\'"]|\\x[0-9a-f]{2})*')
_SIMPLE_ESCAPES = MappingProxyType({0x74: 0x09, 0x6E: 0x0A, 0x72: 0x0D})  # \t \n \r; other \c: c


def unescape_rwkv(text: str) -> bytes:
    """The bytes of one token text, as llama_unescape_rwkv_token reads them.

    Mirrors the C++ byte for byte, quirks included, since the pieces and the trie must agree
    with llama.cpp: \\xHH takes the next two bytes whatever they are ('A'..'F' and non-hex
    bytes give garbage digits, computed as the C++ does on signed chars, modulo 256); a
    trailing lone backslash or a cut-off \\x escape produces nothing.
    """
    raw = text.encode("utf-8")
    if b"\\" not in raw:
        return raw
    if _PYTHON_ESCAPES.fullmatch(raw):  # what the converter writes: Python's own escapes agree
        return codecs.escape_decode(raw)[0]
    out = bytearray()
    escaping = False
    hex_left = acc = 0
    for b in raw:
        if hex_left:
            # (c >= 'a') ? c - 'a' + 10 : c - '0', on a signed char: bytes >= 0x80 are negative.
            value = b - 87 if 0x61 <= b < 0x80 else b - 48
            acc = ((acc << 4) + value) & 0xFF
            hex_left -= 1
            if not hex_left:
                out.append(acc)
                acc = 0
        elif escaping:
            if b == 0x78:  # 'x'
                hex_left = 2
            else:
                out.append(_SIMPLE_ESCAPES.get(b, b))
            escaping = False
        elif b == _BACKSLASH:
            escaping = True
        else:
            out.append(b)
    return bytes(out)


class RwkvVocab:
    """Greedy longest-match tokenization over the UTF-8 bytes of each raw-text fragment.

    llama.cpp walks a byte trie; a trie node exists exactly for the prefixes of the tokens'
    bytes, so one dict from every such prefix to its token id (-1 where it is only a prefix)
    walks the same way, and builds in a fraction of the time nested dicts take. A later id
    replaces an earlier one with the same unescaped bytes, as llama.cpp's trie insert does.
    """

    def __init__(self, tokens: list[str], unk_id: int | None):
        # every token goes into the trie, whatever its type; scores play no part
        node: dict[bytes, int] = {}
        for tid, text in enumerate(tokens):
            data = unescape_rwkv(text)
            if not data:
                continue  # llama.cpp marks the trie's root, which a match never reaches
            node[data] = tid
            for k in range(1, len(data)):
                node.setdefault(data[:k], -1)
        self._node = node
        self._unk = unk_id  # a byte no token starts with becomes it (RWKV's default: none)

    def encode(self, fragment: str, after_special: bool) -> list[int]:
        """Token ids of one raw-text fragment (special tokens already split out); RWKV adds no
        space prefix, so `after_special` changes nothing."""
        data = fragment.encode("utf-8")
        n = len(data)
        node_get = self._node.get
        out: list[int] = []
        pos = 0
        while pos < n:
            tid = node_get(data[pos:pos + 1])
            if tid is None:
                if self._unk is None:
                    # llama.cpp pushes LLAMA_TOKEN_NULL (-1), an id nothing can decode.
                    raise TokenizerError(
                        f"byte 0x{data[pos]:02x} starts no RWKV token and the vocabulary has no unknown token")
                out.append(self._unk)
                pos += 1
                continue
            end = pos + 1
            q = pos + 2
            while q <= n:
                value = node_get(data[pos:q])
                if value is None:
                    break
                if value >= 0:
                    tid, end = value, q
                q += 1
            if tid < 0:
                # llama.cpp would restart at offset 0 and never finish: the vocabulary lacks the
                # one-byte token every real RWKV vocabulary has.
                raise TokenizerError(f"no RWKV token matches the bytes at offset {pos} (byte 0x{data[pos]:02x})")
            out.append(tid)
            pos = end
        return out

    def normal_piece(self, text: str) -> bytes:
        return unescape_rwkv(text)

    def piece(self, token_id: int, text: str, attr: int, special: bool) -> bytes:
        """llama_token_to_piece for RWKV: control and unknown tokens are empty unless `special`;
        every other token, whatever its type (user-defined, byte, unused padding, undefined),
        is its unescaped text."""
        del token_id
        if attr & (CONTROL | UNKNOWN) and not special:
            return b""
        return unescape_rwkv(text)
