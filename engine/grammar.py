"""Constrained decoding: a request's output held to a JSON schema, a grammar or a regex.

The grammar engine is llguidance (MIT; a Rust wheel without dependencies, and llama.cpp's own
optional grammar backend): it compiles JSON Schema, Lark, llama.cpp's GBNF (through its own
converter) and regular expressions, and after each token gives the set of tokens that can follow
as a bitmask over the vocabulary.  We give it the model's vocabulary as bytes per token (our
tokenizer's pieces, control tokens marked special), so it works for every GGUF we load.

Per sequence a GrammarMatcher gives the tokens allowed next; sampling starts from those alone
(the others have probability 0) before any stage -- penalties, top-k, top-p, min-p,
temperature -- as llama.cpp applies its grammar sampler first; then it consumes the sampled token.  When the grammar has been completed only
end-of-generation tokens are allowed; when nothing at all can follow, the sequence stops.  A grammar
with JSON in it is matched beside a shadow grammar that bounds its numbers' digits as llama.cpp's
JSON grammars do (NUMBER_RX), which llguidance's JSON cannot.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from infer.quant.errors import InferError

from .reasoning import CLOSE as THINK_CLOSE
from .reasoning import TAGS as THINK_TAGS
from .reasoning import THOUGHT_SPACE, thought_rules

KINDS = ("json", "json_schema", "gbnf", "lark", "regex")
# Whitespace JSON output may have between tokens: llama.cpp's json-schema-to-grammar SPACE_RULE
# (nothing, a space, or one or two newlines and up to 20 spaces or tabs), not llguidance's default
# of any run of whitespace, with which a small model can indent forever.
JSON_OPTIONS = MappingProxyType({"whitespace_pattern": r"( |\n{1,2}[ \t]{0,20})?"})


# llama.cpp's JSON number (json-schema-to-grammar's integral-part and decimal-part): at most 16
# digits before the point, after it and in the exponent.  llguidance's JSON numbers take any number
# of digits, and a small model asked for {"type": "number", "minimum": 0, "maximum": 1} can write
# 0.7505613301803685432... until max_tokens; it has no option to bound them, so a JSON grammar is
# matched beside its shadow (bounded_shadow): the same grammar with every JSON value in it replaced
# by any JSON value whose numbers are bounded so, and a token is allowed where both allow it.
NUMBER_RX = r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,16})?([eE][-+]?(0|[1-9][0-9]{0,15}))?"
SHADOW_JSON = r"""
infer_json_value: infer_json_ws? infer_json_bare infer_json_ws?
infer_json_bare: infer_json_object | infer_json_array | INFER_JSON_STRING | INFER_JSON_NUMBER | "true" | "false" | "null"
infer_json_object: "{" infer_json_ws? "}" | "{" infer_json_pair ("," infer_json_pair)* "}"
infer_json_pair: infer_json_ws? INFER_JSON_STRING infer_json_ws? ":" infer_json_value
infer_json_array: "[" infer_json_ws? "]" | "[" infer_json_value ("," infer_json_value)* "]"
infer_json_ws: /[ \t\n\r]+/
INFER_JSON_STRING: /"(\\(["\\\/bfnrt]|u[0-9a-fA-F]{4})|[^"\\\x00-\x1f])*"/
INFER_JSON_NUMBER: /""" + NUMBER_RX + "/\n"


class GrammarError(InferError, ValueError):
    """A schema, grammar or regex that cannot be compiled (the message names the problem)."""


@dataclass(frozen=True)
class Grammar:
    """What a request's output must match.  kind: "json" (any JSON object, source unused),
    "json_schema" (source: the schema as JSON text), "gbnf" (llama.cpp's grammar syntax),
    "lark" (llguidance's Lark syntax) or "regex"."""

    kind: str
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"unknown grammar kind {self.kind!r} (choose from {', '.join(KINDS)})")
        if not isinstance(self.source, str):
            raise GrammarError(f"a {self.kind} grammar must be text, got {type(self.source).__name__}")
        if self.kind != "json" and not self.source.strip():
            raise GrammarError(f"the {self.kind} grammar is empty")

    @classmethod
    def json_schema(cls, schema: Any) -> "Grammar":
        """From a schema given as a dict (an API's JSON) or as JSON text (a file)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not valid JSON: {e}") from None
            except RecursionError:
                raise GrammarError(f"the JSON schema nests deeper than {MAX_DEPTH} levels") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"a JSON schema must be an object, got {type(schema).__name__}")
        if too_deep(schema):
            raise GrammarError(f"the JSON schema nests deeper than {MAX_DEPTH} levels")
        return cls("json_schema", json.dumps(as_llama_cpp(schema)))


# How deep a schema from a request may nest: as_llama_cpp and the tool-call code walk schemas
# recursively, and a request can nest hundreds of levels before json.loads gives up, enough to
# exhaust Python's stack there; llguidance refuses schemas nested half as deep anyway.
MAX_DEPTH = 100


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether parsed JSON nests more than limit arrays and objects (checked without recursing)."""
    todo = [(value, 1)]
    while todo:
        v, depth = todo.pop()
        children = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        todo.extend((c, depth + 1) for c in children)
    return False


INT_LIMIT = 10**16 - 1  # llama.cpp's JSON integers: at most 16 digits


def as_llama_cpp(schema: Any) -> Any:
    """The schema read as llama.cpp's json-schema-to-grammar reads it, where JSON Schema's defaults
    would let a small model run on until max_tokens: an object that lists properties and says
    nothing of others takes no others ("additionalProperties": false), and an integer without
    bounds has at most 16 digits."""
    if isinstance(schema, list):
        return [as_llama_cpp(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: as_llama_cpp(v) for k, v in schema.items()}
    if "properties" in out and "additionalProperties" not in out and out.get("type", "object") == "object":
        out["additionalProperties"] = False
    if out.get("type") == "integer":
        out.setdefault("minimum", -INT_LIMIT)
        out.setdefault("maximum", INT_LIMIT)
    return out


def with_thought(grammar: Grammar, kind: str, opened: bool, lit) -> Grammar:
    """A grammar that holds the reply from its first token, with room to think first: one optional
    thought in the reasoning style's markers (opened: the prompt opened it, so its rest up to the
    close, required), then the grammar as before.  lit(text): a marker as one token where the
    vocabulary has it, else quoted text (engine/tool_calls.py's).  JSON kinds go inside as %json;
    a Lark grammar's start rule is renamed."""
    if grammar.kind == "lark":
        if re.search(r"^\s*(thought|thought_text|held)\b", grammar.source, re.M):
            raise GrammarError("the grammar already names a rule thought, thought_text or held")
        held = re.sub(r"^start:", "held:", grammar.source, count=1, flags=re.M)
    elif grammar.kind in ("json", "json_schema"):
        schema = json.loads(grammar.source) if grammar.kind == "json_schema" else {"type": "object"}
        held = "held: %json " + json.dumps({**schema, "x-guidance": dict(JSON_OPTIONS)})
    else:
        raise GrammarError(f"a {grammar.kind} grammar cannot take a thought before it")
    thought = f"thought {THOUGHT_SPACE}" if opened else f"(thought {THOUGHT_SPACE})?"
    start = f"start: {thought} held"
    return Grammar("lark", "\n".join([start, thought_rules(kind, opened, lit), held]))


def _llguidance():
    try:
        import llguidance
    except ImportError:  # a dependency of the package; only a broken install lacks it
        raise GrammarError("constrained output needs the llguidance package: pip install llguidance") from None
    return llguidance


def _lark(grammar: Grammar) -> str:
    """The grammar in llguidance's form (not yet checked)."""
    llg = _llguidance()
    M = llg.LLMatcher
    if grammar.kind == "json":
        return M.grammar_from_json_schema({"type": "object"}, defaults=dict(JSON_OPTIONS))
    if grammar.kind == "json_schema":
        try:
            return M.grammar_from_json_schema(grammar.source, defaults=dict(JSON_OPTIONS))
        except ValueError as e:
            raise GrammarError(f"invalid JSON schema: {e}") from None
    if grammar.kind == "regex":
        return M.grammar_from_regex(grammar.source)
    if grammar.kind == "gbnf":
        try:
            return M.grammar_from_lark(llg.gbnf_to_lark.any_to_lark(grammar.source))
        except Exception as e:  # the converter raises plain exceptions on syntax errors
            raise GrammarError(f"invalid GBNF grammar: {_one_line(e)}") from None
    return M.grammar_from_lark(grammar.source)


def bounded_shadow(grammar: Grammar) -> str | None:
    """The Lark grammar a JSON grammar is matched beside (see NUMBER_RX): a JSON schema's is any JSON
    value, a Lark grammar's is itself with each %json replaced by any JSON value; None for grammars
    without JSON (GBNF and regexes spell their numbers themselves)."""
    if grammar.kind in ("json", "json_schema"):
        return "start: infer_json_value\n" + SHADOW_JSON
    if grammar.kind != "lark" or "%json" not in grammar.source:
        return None
    if re.search(r"\binfer_json_|\bINFER_JSON_", grammar.source, re.I):
        raise GrammarError("the grammar already names a rule infer_json_...")
    out, at, decoder = [], 0, json.JSONDecoder()
    for m in re.finditer(r"%json\s*", grammar.source):
        if m.start() < at:
            continue
        try:
            end = decoder.raw_decode(grammar.source, m.end())[1]
        except json.JSONDecodeError:
            return None  # not a schema llguidance takes either: its error names the problem
        out += [grammar.source[at:m.start()], "infer_json_value"]
        at = end
    return "".join(out) + grammar.source[at:] + "\n" + SHADOW_JSON


def _one_line(message: object) -> str:
    """An error's text on one line, at most 300 characters (grammar errors quote the grammar)."""
    text = " ".join(str(message).split())
    return text if len(text) <= 300 else text[:297] + "..."


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads from a tokenizer: every token's bytes (control
    tokens spelled out and listed as special, so a grammar can never produce them as text),
    the EOS/BOS ids, and a callable that tokenizes text."""

    def __init__(self, tok):
        self._tok = tok
        n = tok.vocab_size
        self.tokens = [tok.token_to_piece(i, special=True) for i in range(n)]
        self.special_token_ids = [i for i in range(n) if tok.is_control(i)]
        eos = tok.eos_id if tok.eos_id is not None else tok.eot_id
        self.eos_token_id = eos if eos is not None else 0
        self.bos_token_id = tok.bos_id

    def __call__(self, text) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        ids = self._tok.encode(text, add_special=False, parse_special=False)
        if b"".join(self.tokens[i] for i in ids) == text.encode("utf-8"):
            return ids
        # a tokenization that does not spell the text back (SentencePiece reads a literal U+2581
        # as its space mark): the runs between such characters as usual, those characters as bytes
        out, run = [], ""
        for ch in text:
            bytes_ = self._as_bytes(ch)
            if bytes_ is None:
                run += ch
                continue
            if run:
                out += self._tok.encode(run, add_special=False, parse_special=False)
                run = ""
            out += bytes_
        if run:
            out += self._tok.encode(run, add_special=False, parse_special=False)
        return out

    def _as_bytes(self, ch: str) -> list[int] | None:
        """The byte tokens of a character that does not spell itself back alone, else None."""
        ids = self._tok.encode(ch, add_special=False, parse_special=False)
        if b"".join(self.tokens[i] for i in ids) == ch.encode("utf-8"):
            return None
        byte_ids = [self._tok.token_id(f"<0x{b:02X}>") for b in ch.encode("utf-8")]
        return None if None in byte_ids else byte_ids


class GrammarCompiler:
    """Compiles Grammars for one tokenizer; the vocabulary is handed to llguidance once, on first
    use (1-2 s for a 150-260k vocabulary), and the last few grammars are kept compiled (clients
    send the same schema with every request).  Safe to call from several threads."""

    CACHED = 32

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._ll = None
        self._ll_lock = threading.Lock()  # the vocabulary is handed over once
        self._lock = threading.Lock()  # the cache; compiling runs outside it
        self._cache: OrderedDict[Grammar, CompiledGrammar] = OrderedDict()

    def _lltokenizer(self):
        with self._ll_lock:
            if self._ll is None:
                llg = _llguidance()
                tok = self._tokenizer
                eog = sorted(i for i in range(tok.vocab_size) if tok.is_eog(i))
                wrapper = llg.TokenizerWrapper(_Vocabulary(tok))
                self._ll = llg.LLTokenizer(wrapper, n_vocab=tok.vocab_size, eos_token=eog or None)
            return self._ll

    def compile(self, grammar: Grammar) -> "CompiledGrammar":
        """Check the grammar against the vocabulary and build it (up to a second for a large one);
        raises GrammarError naming the problem."""
        if not isinstance(grammar, Grammar):
            raise GrammarError(f"expected a Grammar, got {type(grammar).__name__}")
        with self._lock:
            compiled = self._cache.get(grammar)
            if compiled is not None:
                self._cache.move_to_end(grammar)
                return compiled
        compiled = self._compile(grammar)
        with self._lock:
            self._cache[grammar] = compiled
            while len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, grammar: Grammar) -> "CompiledGrammar":
        text = _lark(grammar)
        llg = _llguidance()
        ll = self._lltokenizer()
        prototype = llg.LLMatcher(ll, text, log_level=0)  # builds and checks the grammar once
        if prototype.is_error():
            raise GrammarError(f"invalid {grammar.kind.replace('_', ' ')}: {_one_line(prototype.get_error())}")
        shadow_text, shadow = bounded_shadow(grammar), None
        if shadow_text is not None:
            shadow = llg.LLMatcher(ll, llg.LLMatcher.grammar_from_lark(shadow_text), log_level=0)
            if shadow.is_error():
                raise GrammarError(f"invalid {grammar.kind.replace('_', ' ')}: {_one_line(shadow.get_error())}")
        tok = self._tokenizer
        return CompiledGrammar(prototype, ll, tok.vocab_size,
                               lambda t: tok.encode(t, add_special=False, parse_special=True), shadow)


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A checked, built grammar: matchers (one per sequence) are copies of its prototype."""

    prototype: Any  # an llguidance LLMatcher at the grammar's start, never advanced
    lltokenizer: Any
    vocab_size: int
    encode: Any  # text -> token ids, special tokens parsed (GrammarMatcher.follow)
    shadow: Any = None  # an LLMatcher of bounded_shadow(grammar) at its start, or None

    def matcher(self) -> "GrammarMatcher":
        return GrammarMatcher(self)


class GrammarMatcher:
    """One sequence's place in its grammar: masks the next token's logits, then follows it."""

    def __init__(self, compiled: CompiledGrammar):
        self._ll = compiled.lltokenizer
        self._encode = compiled.encode
        self._m = compiled.prototype.deep_copy()
        self._shadow = compiled.shadow.deep_copy() if compiled.shadow is not None else None
        self.vocab_size = compiled.vocab_size
        self._words = np.zeros((compiled.vocab_size + 31) // 32, np.int32)  # the allowed-token bitmask
        self._shadow_words = np.zeros_like(self._words) if self._shadow is not None else None

    def allowed(self) -> np.ndarray:
        """The tokens the grammar allows next: in most states of a grammar few fit, and then their
        ids, ascending (int64; empty: nothing can follow); where nearly all fit (inside a string) a
        (V,) bool mask, which costs less than a quarter million ids."""
        self._m.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self._shadow is not None:  # a token both the grammar and its shadow allow
            self._shadow.unsafe_compute_mask_ptr(self._shadow_words.ctypes.data, self._shadow_words.nbytes)
            np.bitwise_and(self._words, self._shadow_words, out=self._words)
        words = self._words.view(np.uint32)
        nz = np.flatnonzero(words)
        if nz.size * 8 > words.size:
            return np.unpackbits(words.view(np.uint8), bitorder="little")[:self.vocab_size].view(np.bool_)
        rows, bits = np.nonzero(np.unpackbits(words[nz].view(np.uint8), bitorder="little").reshape(-1, 32))
        ids = nz[rows] * 32 + bits
        return ids[ids < self.vocab_size]

    def allowed_ids(self) -> np.ndarray:
        """allowed(), always as ids."""
        a = self.allowed()
        return np.flatnonzero(a) if a.dtype == np.bool_ else a

    def restrict(self, logits: np.ndarray, exact: bool) -> np.ndarray | None:
        """Hold the next token's logits (V,) to the grammar.  Returns the ids the sampler starts from
        (empty: nothing can follow), or None where nearly all are allowed: then the few others'
        logits are set to -inf here and the sampler takes the whole vocabulary.  exact: set the
        disallowed logits to -inf in every case (so logprobs report the constrained distribution)."""
        allowed = self.allowed()
        if allowed.dtype == np.bool_:
            if not allowed.any():
                return np.zeros(0, np.int64)
            np.putmask(logits, ~allowed, -np.inf)
            return None
        if exact and allowed.size:
            kept = logits[allowed]
            logits.fill(-np.inf)
            logits[allowed] = kept
        return allowed

    def follow(self, text: str) -> bool:
        """Feed text already written; False if the grammar refuses it.  The text is tokenized with
        special tokens read as such (a marker the grammar names as one token), else spelled out."""
        for ids in (self._encode(text), self._ll.tokenize_bytes(text.encode("utf-8"))):
            m = self._m.deep_copy()
            shadow = self._shadow.deep_copy() if self._shadow is not None else None
            if all(m.consume_token(int(t)) and (shadow is None or shadow.consume_token(int(t))) for t in ids):
                self._m, self._shadow = m, shadow
                return True
        return False

    def consume(self, token: int) -> None:
        for m in (self._m, self._shadow):
            if m is not None and not m.consume_token(int(token)):
                raise GrammarError(f"token {token} does not follow the grammar: {m.get_error()}")

    @property
    def done(self) -> bool:
        """Whether nothing but end of generation can follow (the grammar has been completed)."""
        return self._m.is_stopped()


class LazyGrammar:
    """A grammar that waits until the reply shows one of its triggers (a tool call's marker;
    "^text": only at the start of the answer, after whitespace): then the reply from the trigger on
    is fed to it, and it holds the rest; if it refuses that text, the reply stays free for good.
    A model's thinking (up to </think>, from a <think> it opens or the prompt opened: `thinking`;
    Mistral's [THINK] to [/THINK]) is not searched: a call written while thinking is not the answer's."""

    def __init__(self, matcher: GrammarMatcher, triggers: tuple[str, ...], thinking: bool = False):
        self.matcher, self.triggers, self.thinking = matcher, triggers, thinking
        self.reply = ""  # the reply so far
        self.started: GrammarMatcher | None = None
        self.given_up = False

    def _answer_start(self) -> int | None:
        """Where the answer starts in the reply so far (None: still thinking)."""
        body = self.reply.lstrip()
        opened = next((close for open_, close in THINK_TAGS.values() if body.startswith(open_)), None)
        if not (self.thinking or opened):
            return 0
        close = opened or THINK_CLOSE  # a thought the prompt opened is a <think>
        end = self.reply.find(close)
        return None if end < 0 else end + len(close)

    def seen(self, piece: str) -> bool:
        """Take the reply's next text; True once the grammar holds (then use .started)."""
        if self.given_up or self.started is not None:
            return self.started is not None
        self.reply += piece
        start = self._answer_start()
        if start is None:
            return False
        answer = self.reply[start:]
        for trig in self.triggers:
            if trig.startswith("^"):
                body = answer.lstrip()
                at = len(answer) - len(body) if body.startswith(trig[1:]) else -1
            else:
                at = answer.find(trig)
            if at >= 0:
                if self.matcher.follow(answer[at:]):
                    self.started = self.matcher
                    return True
                self.given_up = True
                return False
        return False
