r"""A pre-tokenizer's chain of split regexes, compiled to a backtracking program run in numba.

Oniguruma (through `tokenizers`' Split) spends most of a byte-level BPE encode matching the
pre-tokenizer's regexes: about 0.4 s per MB for Llama 3's, where llama.cpp's hand-written matcher
takes half that. This module runs the same regexes, as onig_regex writes them, with the same
semantics (leftmost match, alternatives in order, greedy quantifiers, backtracking, lookaheads;
the unmatched text between matches kept as pieces of its own, each regex splitting the pieces the
previous one left) as a small program of single-character tests, jumps and splits interpreted in
numba. Which character classes a code point belongs to is asked of Oniguruma itself, once per code
point and tokenizer, so a class means exactly what it means to the Split it replaces.

Regexes outside the subset (empty matches, lazy or possessive quantifiers, anchors other than
the end, lookaheads inside lookaheads, more than 63 distinct classes) raise Unsupported: the
caller keeps Oniguruma for those.
"""
from __future__ import annotations

import numpy as np
from numba import njit
from tokenizers import Regex, normalizers

CLS, SPLIT, JMP, MATCH, END, LOOK, LOOKEND = range(7)
_KNOWN = np.uint64(1 << 63)  # a code point's class bits have been asked for
_MAX_CLASSES = 63


class Unsupported(Exception):
    """The regex uses something this matcher does not implement."""


# ------------------------------------------------------------------------------ parsing


class _Parser:
    """Recursive descent over the onig regex subset the pre-tokenizers use; the AST's nodes are
    ("cls", source of a one-character class), ("cat", [...]), ("alt", [...]),
    ("rep", node, min, max or -1), ("look", node, negated) and ("end",)."""

    def __init__(self, regex: str):
        self.r, self.i = regex, 0

    def parse(self):
        node = self._alt()
        if self.i != len(self.r):
            raise Unsupported(f"unbalanced ')' at {self.i}")
        return node

    def _alt(self):
        branches = [self._cat()]
        while self.i < len(self.r) and self.r[self.i] == "|":
            self.i += 1
            branches.append(self._cat())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def _cat(self):
        items = []
        while self.i < len(self.r) and self.r[self.i] not in "|)":
            items.append(self._repeat())
        return items[0] if len(items) == 1 else ("cat", items)

    def _repeat(self):
        node = self._atom()
        r = self.r
        while self.i < len(r) and r[self.i] in "?*+{":
            c = r[self.i]
            if c == "{":
                close = r.find("}", self.i)
                body = r[self.i + 1:close]
                lo, _, hi = body.partition(",")
                if close < 0 or not lo.isdigit() or (hi and not hi.isdigit()):
                    raise Unsupported(f"quantifier {{{body}}}")
                mn, mx = int(lo), (int(lo) if "," not in body else (int(hi) if hi else -1))
                self.i = close + 1
            else:
                mn, mx = {"?": (0, 1), "*": (0, -1), "+": (1, -1)}[c]
                self.i += 1
            if self.i < len(r) and r[self.i] in "?+":
                raise Unsupported("lazy or possessive quantifier")
            node = ("rep", node, mn, mx)
        return node

    def _atom(self):
        r, i = self.r, self.i
        c = r[i]
        if c == "(":
            if r.startswith("(?:", i):
                self.i = i + 3
                kind = None
            elif r.startswith("(?=", i) or r.startswith("(?!", i):
                self.i = i + 3
                kind = r[i + 2] == "!"
            elif r.startswith("(?", i):
                raise Unsupported("group flags")
            else:
                self.i = i + 1
                kind = None
            node = self._alt()
            if self.i >= len(r) or r[self.i] != ")":
                raise Unsupported("unclosed group")
            self.i += 1
            return node if kind is None else ("look", node, kind)
        if c == "[":
            j = i + 1 + (r[i + 1] == "^")
            j += r[j] == "]"  # a ']' first in the class is a literal
            depth = 1
            while depth:
                if j >= len(r):
                    raise Unsupported("unclosed class")
                if r[j] == "\\":
                    j += 2
                    continue
                depth += {"[": 1, "]": -1}.get(r[j], 0)
                j += 1
            self.i = j
            return ("cls", r[i:j])
        if c == "\\":
            e = r[i + 1]
            if e in "px" and r[i + 2:i + 3] == "{":
                j = r.index("}", i) + 1
            elif e == "z":
                self.i = i + 2
                return ("end",)
            elif e.isalnum() and e not in "sSrntfvdw":
                raise Unsupported(f"escape \\{e}")
            else:
                j = i + 2
            self.i = j
            return ("cls", r[i:j])
        if c in ".^$)":
            raise Unsupported(f"{c!r} outside a class")
        self.i = i + 1
        return ("cls", c)


def _nullable(node) -> bool:
    kind = node[0]
    if kind == "cls":
        return False
    if kind in ("end", "look"):
        return True
    if kind == "cat":
        return all(_nullable(n) for n in node[1])
    if kind == "alt":
        return any(_nullable(n) for n in node[1])
    return node[2] == 0 or _nullable(node[1])


# ------------------------------------------------------------------------------ compiling


class _Program:
    """Instructions as three int32 columns: op, a, b (see _run)."""

    def __init__(self, classes: list[str]):
        self.ops: list[list[int]] = []
        self.classes = classes  # shared by the chain's regexes: one bit per class

    def emit(self, op: int, a: int = 0, b: int = 0) -> int:
        self.ops.append([op, a, b])
        return len(self.ops) - 1

    def compile(self, node, in_look: bool = False) -> None:
        kind = node[0]
        if kind == "cls":
            if node[1] not in self.classes:
                if len(self.classes) == _MAX_CLASSES:
                    raise Unsupported("too many classes")
                self.classes.append(node[1])
            self.emit(CLS, self.classes.index(node[1]))
        elif kind == "end":
            self.emit(END)
        elif kind == "cat":
            for n in node[1]:
                self.compile(n, in_look)
        elif kind == "alt":
            jumps = []
            for n in node[1][:-1]:
                split = self.emit(SPLIT)
                self.ops[split][1] = split + 1
                self.compile(n, in_look)
                jumps.append(self.emit(JMP))
                self.ops[split][2] = len(self.ops)
            self.compile(node[1][-1], in_look)
            for j in jumps:
                self.ops[j][1] = len(self.ops)
        elif kind == "look":
            if in_look:
                raise Unsupported("lookahead inside a lookahead")
            look = self.emit(LOOK, 0, int(node[2]))
            self.compile(node[1], True)
            self.emit(LOOKEND)
            self.ops[look][1] = len(self.ops)  # where matching goes on
        else:
            self._repeat(node, in_look)

    def _repeat(self, node, in_look: bool) -> None:
        _, body, mn, mx = node
        if _nullable(body):
            raise Unsupported("a repeated part that can match nothing")
        for _ in range(mn):
            self.compile(body, in_look)
        if mx < 0:  # greedy loop: try one more first
            split = self.emit(SPLIT)
            self.compile(body, in_look)
            self.emit(JMP, split)
            self.ops[split][1:] = [split + 1, len(self.ops)]
            return
        splits = []
        for _ in range(mx - mn):
            splits.append(self.emit(SPLIT))
            self.ops[splits[-1]][1] = splits[-1] + 1
            self.compile(body, in_look)
        for s in splits:
            self.ops[s][2] = len(self.ops)

    def array(self) -> np.ndarray:
        return np.array(self.ops, dtype=np.int32).reshape(-1, 3)


class SplitChain:
    """A pre-tokenizer's regexes (onig syntax), compiled: pieces(text) splits as the chain of
    Split(isolated) steps does. Keeps, per tokenizer, the class bits of the code points seen."""

    def __init__(self, regexes: list[str]):
        self.classes: list[str] = []
        self.programs = []
        for regex in regexes:
            tree = _Parser(regex).parse()
            if _nullable(tree):
                raise Unsupported(f"{regex!r} can match nothing")
            prog = _Program(self.classes)
            prog.compile(tree)
            prog.emit(MATCH)
            self.programs.append(prog.array())
        self._matchers = [normalizers.Replace(Regex(c), "\x00") for c in self.classes]
        self._bits = np.zeros(0x110000, dtype=np.uint64)  # code point -> class bits | _KNOWN
        self._learn(np.arange(128, dtype=np.uint32))

    def _learn(self, cps: np.ndarray) -> None:
        """Ask Oniguruma which classes each of `cps` (unique, not surrogates) belongs to."""
        text = cps.astype("<u4").tobytes().decode("utf-32-le")
        bits = np.full(len(cps), _KNOWN, dtype=np.uint64)
        for k, matcher in enumerate(self._matchers):
            replaced = np.frombuffer(matcher.normalize_str(text).encode("utf-32-le"), dtype="<u4")
            hit = replaced != cps
            if (cps == 0).any():  # "\x00" is the marker: ask about it with another one
                zero = normalizers.Replace(Regex(self.classes[k]), "\x01").normalize_str("\x00") == "\x01"
                hit[cps == 0] = zero
            bits[hit] |= np.uint64(1 << k)
        self._bits[cps] = bits

    def pieces(self, text: str, starts: np.ndarray | None = None, ends: np.ndarray | None = None):
        """(code points, piece starts, piece ends) of `text` split by the whole chain, starting from
        the pieces starts/ends (code point offsets; default: the whole text), each split alone.
        UnicodeEncodeError where the text holds a lone surrogate."""
        cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
        bits = self._bits[cps]
        unknown = (bits & _KNOWN) == 0
        if unknown.any():
            self._learn(np.unique(cps[unknown]))
            bits = self._bits[cps]
        if starts is None:
            starts, ends = np.zeros(1, np.int64), np.full(1, len(cps), np.int64)
        for prog in self.programs:
            starts, ends = _split_all(prog, bits, starts, ends, len(cps))
        return cps, starts, ends


# ------------------------------------------------------------------------------ matching


@njit(cache=True)
def _run(prog, bits, pos, end, stack):
    # prog: (P, 3) int32 op/a/b; bits: (N,) uint64 class bits per code point; stack: (S, 2) int64
    # backtrack points (pc, pos). Returns the end of the leftmost-first match at pos, -1 for none,
    # -2 if the stack is full. A lookahead pushes a marker (-1 - its pc, pos) and runs its body:
    # the body's LOOKEND drops the body's backtrack points down to the marker (a lookahead is
    # atomic) and goes on, a backtrack into the marker means the body failed. Lookaheads do not
    # nest (the compiler refuses it), so one marker index is enough.
    pc = 0
    top = 0
    mark = 0
    while True:
        op = prog[pc, 0]
        ok = True
        if op == 0:  # CLS
            if pos < end and (bits[pos] >> np.uint64(prog[pc, 1])) & np.uint64(1):
                pos += 1
                pc += 1
            else:
                ok = False
        elif op == 1 or op == 5:  # SPLIT (a first, b on failure) or LOOK (the marker)
            if top == stack.shape[0]:
                return -2
            stack[top, 0] = prog[pc, 2] if op == 1 else -1 - pc
            stack[top, 1] = pos
            if op == 5:
                mark = top
            top += 1
            pc = prog[pc, 1] if op == 1 else pc + 1
        elif op == 2:  # JMP
            pc = prog[pc, 1]
        elif op == 3:  # MATCH
            return pos
        elif op == 4:  # END
            if pos == end:
                pc += 1
            else:
                ok = False
        else:  # LOOKEND: the lookahead's body matched
            look = -1 - stack[mark, 0]
            pos = stack[mark, 1]
            top = mark
            if prog[look, 2] == 1:
                ok = False
            else:
                pc = prog[look, 1]
        while not ok:  # backtrack
            if top == 0:
                return -1
            top -= 1
            pc = stack[top, 0]
            pos = stack[top, 1]
            if pc >= 0:
                ok = True
            else:  # the lookahead's body failed
                look = -1 - pc
                if prog[look, 2] == 1:
                    pc = prog[look, 1]
                    ok = True


@njit(cache=True)
def _split(prog, bits, starts, ends, out_s, out_e, stack):
    # starts, ends: (M,) int64 the pieces to split; out_s, out_e: (N,) int64, N >= the text's length.
    # Each piece is split at the matches of prog (searched leftmost, from each match's end), the
    # text between them kept; returns the number of pieces written, or -2 if the stack was too small.
    n = 0
    for p in range(starts.shape[0]):
        end = ends[p]
        gap = pos = starts[p]
        while pos < end:
            m = _run(prog, bits, pos, end, stack)
            if m == -2:
                return -2
            if m < 0:
                pos += 1
                continue
            if gap < pos:
                out_s[n], out_e[n] = gap, pos
                n += 1
            out_s[n], out_e[n] = pos, m
            n += 1
            gap = pos = m
        if gap < end:
            out_s[n], out_e[n] = gap, end
            n += 1
    return n


def _split_all(prog: np.ndarray, bits: np.ndarray, starts: np.ndarray, ends: np.ndarray, size: int):
    out_s, out_e = np.empty(size, np.int64), np.empty(size, np.int64)
    depth = 256
    while True:
        stack = np.empty((depth, 2), np.int64)
        n = _split(prog, bits, starts, ends, out_s, out_e, stack)
        if n >= 0:
            return out_s[:n], out_e[:n]
        depth *= 4  # a long run (of letters, spaces) backtracks through one entry per character
