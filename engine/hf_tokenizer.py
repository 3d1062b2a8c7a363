"""The tokenizer of a model folder (MLX / Hugging Face): tokenizer.json run by the `tokenizers`
library, behind the interface of engine.tokenizer.Tokenizer (what the engine, chat and server use).

Special tokens follow HF: added tokens flagged `special` are control tokens (matched in text only
when parse_special, rendered only when asked), other added tokens are always matched and rendered
as their text. BOS/EOS come from tokenizer_config.json (bos_token, eos_token, add_bos_token,
add_eos_token), else config.json / the post-processor; the end-of-generation set adds
generation_config.json's and config.json's eos_token_id lists and the end-of-turn tokens llama.cpp
recognises by their text, so a folder stops where the GGUF of the same model would.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterable

from tokenizers import Tokenizer as HFTokenizerCore

from infer.engine.bpe import byte_to_unicode
from infer.engine.detokenizer import IncrementalDetokenizer
from infer.engine.tokenizer import EOG_TEXTS, TokenizerError, check_text, check_token_id, decode_pieces
from infer.models.hf_vocab import detect_pre_tokenizer

_SPACE = "\u2581"  # SentencePiece's visible space


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: not valid JSON: {e}") from None
    return data if isinstance(data, dict) else {}


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json spells a token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _parts(node: Any) -> list[dict[str, Any]]:
    """The components of a normalizer / pre-tokenizer / decoder, Sequences flattened."""
    if not isinstance(node, dict):
        return []
    kids = node.get("normalizers") or node.get("pretokenizers") or node.get("decoders")
    if node.get("type") == "Sequence" and isinstance(kids, list):
        return [p for k in kids for p in _parts(k)]
    return [node]


def folder_chat_template(folder: Path, tokenizer_config: dict[str, Any]) -> str | None:
    """chat_template.jinja (where newer transformers save it), else tokenizer_config.json's
    chat_template (a string, or named templates of which 'default' is used)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    tmpl = tokenizer_config.get("chat_template")
    if isinstance(tmpl, list):
        tmpl = next((t.get("template") for t in tmpl if isinstance(t, dict) and t.get("name") == "default"), None)
    return tmpl if isinstance(tmpl, str) else None


class HFTokenizer:
    """Encode and decode text with a folder's tokenizer.json; see `from_folder`."""

    def __init__(self, tokenizer_json: str, tokenizer_config: dict[str, Any] | None = None,
                 model_config: dict[str, Any] | None = None, generation_config: dict[str, Any] | None = None,
                 n_vocab: int | None = None, architecture: str = "", chat_template: str | None = None):
        tc, mc, gc = tokenizer_config or {}, model_config or {}, generation_config or {}
        try:
            self._hf = HFTokenizerCore.from_str(tokenizer_json)
            spec = json.loads(tokenizer_json)
        except Exception as e:  # tokenizers raises plain Exceptions for malformed files
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise TokenizerError(f"tokenizer.json cannot be loaded: {first}") from None
        self._lock = threading.Lock()  # encode_special_tokens is a setting of the shared tokenizer
        # The id space, not the token count (get_vocab_size): a vocabulary with gaps has ids past its size.
        n_tok = max(self._hf.get_vocab_size(with_added_tokens=True),
                    max(self._hf.get_vocab(with_added_tokens=True).values(), default=-1) + 1)
        if n_vocab and n_tok > n_vocab:  # ids past the embedding would index outside it (MLX's take checks nothing)
            raise TokenizerError(f"tokenizer.json has {n_tok} tokens but the model's embedding only {n_vocab} rows")
        # The embedding may have rows past the tokenizer (padding): those ids decode to nothing.
        self.vocab_size: int = max(n_tok, n_vocab or 0)
        self._n_tok = n_tok
        self._special: set[int] = set()
        self._added: dict[int, str] = {}
        for tid, tok in self._hf.get_added_tokens_decoder().items():
            self._added[int(tid)] = tok.content
            if tok.special:
                self._special.add(int(tid))
        self.architecture = architecture
        self.chat_template: str | None = chat_template

        model = spec.get("model") or {}
        decoders = [p.get("type") for p in _parts(spec.get("decoder"))]
        pres = _parts(spec.get("pre_tokenizer"))
        self._byte_level = "ByteLevel" in decoders or any(p.get("type") == "ByteLevel" for p in pres)
        # What engine.tokenizer calls the vocabulary type: 'gpt2' (byte-level BPE) or 'llama'
        # (SentencePiece-style pieces with '▁' and byte fallback); picks the built-in chat template.
        self.model_type = "gpt2" if self._byte_level else "llama"
        self.pre: str | None = detect_pre_tokenizer(spec) if self._byte_level else None
        self._byte_fallback = bool(model.get("byte_fallback"))
        self._char_to_byte = {c: b for b, c in enumerate(byte_to_unicode())} if self._byte_level else {}
        normalizers = _parts(spec.get("normalizer"))
        self.add_space_prefix = (
            any(n.get("type") == "Prepend" and n.get("prepend") == _SPACE for n in normalizers)
            or any(p.get("type") == "Metaspace" and p.get("prepend_scheme", "always") != "never"
                   and p.get("add_prefix_space", True) for p in pres))
        self.clean_spaces = bool(tc.get("clean_up_tokenization_spaces", False))

        bos_text, eos_text = _token_content(tc.get("bos_token")), _token_content(tc.get("eos_token"))
        self._bos = self._hf.token_to_id(bos_text) if bos_text else None
        self._eos = self._hf.token_to_id(eos_text) if eos_text else None
        text_config = mc.get("text_config") if isinstance(mc.get("text_config"), dict) else {}
        cfg_eos = _ids(mc.get("eos_token_id")) + _ids(text_config.get("eos_token_id"))
        if self._bos is None:
            self._bos = next(iter(_ids(mc.get("bos_token_id")) + _ids(gc.get("bos_token_id"))), None)
        if self._eos is None:
            self._eos = next(iter(cfg_eos + _ids(gc.get("eos_token_id"))), None)
        try:  # the first encode: tokenizers finds some broken files only now (an unk token not in the vocabulary)
            self.add_bos, self.add_eos = self._post_processor_adds()
        except Exception as e:
            if type(e) is not Exception:  # tokenizers' errors are plain Exceptions; anything else is a bug
                raise
            first = str(e).splitlines()[0] if str(e) else repr(e)
            raise TokenizerError(f"tokenizer.json cannot encode text: {first}") from None
        if isinstance(tc.get("add_bos_token"), bool):
            self.add_bos = tc["add_bos_token"]
        if isinstance(tc.get("add_eos_token"), bool):
            self.add_eos = tc["add_eos_token"]

        eog = {self._eos, *cfg_eos, *_ids(gc.get("eos_token_id"))}
        by_text = {text: tid for tid, text in self._added.items() if tid in self._special}
        self._eot = next((by_text[t] for t in EOG_TEXTS if t in by_text), None)
        eog.update(by_text[t] for t in EOG_TEXTS if t in by_text)
        self.eog_ids: frozenset[int] = frozenset(i for i in eog if i is not None and 0 <= i < self.vocab_size)

    @classmethod
    def from_folder(cls, folder: str | Path, n_vocab: int | None = None, architecture: str = "") -> "HFTokenizer":
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{folder}: no tokenizer.json")
        tc = _read_json(folder / "tokenizer_config.json")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise TokenizerError(f"{path}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
        return cls(text, tc, _read_json(folder / "config.json"),
                   _read_json(folder / "generation_config.json"), n_vocab, architecture,
                   folder_chat_template(folder, tc))

    def _post_processor_adds(self) -> tuple[bool, bool]:
        """Whether tokenizer.json's post-processor adds BOS / EOS (Llama 3 adds BOS there only);
        learns their ids from it when the configs named none."""
        plain = self._hf.encode("a", add_special_tokens=False).ids
        full = self._hf.encode("a", add_special_tokens=True).ids
        if len(full) <= len(plain):
            return False, False
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), None)
        if at is None:
            return False, False
        before, after = full[:at], full[at + len(plain):]
        if before and self._bos is None:
            self._bos = before[0]
        if after and self._eos is None:
            self._eos = after[-1]
        return bool(before), bool(after)

    # ------------------------------------------------------------------ properties

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_id(self) -> int | None:
        return self._eos

    @property
    def eot_id(self) -> int | None:
        return self._eot

    @property
    def eom_id(self) -> int | None:
        return self._hf.token_to_id("<|eom_id|>") if "<|eom_id|>" in self._added.values() else None

    @property
    def unk_id(self) -> int | None:
        return None

    @property
    def pad_id(self) -> int | None:
        return None

    def special(self, name: str) -> int | None:
        """Tokenizer.special's: BOS, EOS, EOT and EOM; a tokenizer.json names no FIM tokens."""
        return {"bos": self.bos_id, "eos": self.eos_id, "eot": self.eot_id, "eom": self.eom_id}.get(name)

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.eog_ids

    def is_control(self, token_id: int) -> bool:
        return self._check_id(token_id) in self._special

    def token_text(self, token_id: int) -> str:
        tid = self._check_id(token_id)
        return (self._hf.id_to_token(tid) or "") if tid < self._n_tok else ""

    def token_id(self, text: str) -> int | None:
        return self._hf.token_to_id(text)

    def _check_id(self, token_id: Any) -> int:
        return check_token_id(token_id, self.vocab_size)

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`; add_special adds BOS/EOS where the folder asks for them;
        parse_special lets special tokens written in the text become their ids."""
        check_text(text)
        with self._lock:
            self._hf.encode_special_tokens = not parse_special
            try:
                ids = self._hf.encode(text, add_special_tokens=False).ids if text else []
            finally:
                self._hf.encode_special_tokens = False
        if add_special and self.add_bos:
            if self._bos is None:
                raise TokenizerError("tokenizer asks for a BOS token but defines none")
            ids = [self._bos, *ids]
        if add_special and self.add_eos:
            if self._eos is None:
                raise TokenizerError("tokenizer asks for an EOS token but defines none")
            ids = [*ids, self._eos]
        return ids

    # ------------------------------------------------------------------ decoding

    def token_to_piece(self, token_id: int, special: bool = False) -> bytes:
        """Bytes of one token: special tokens only when `special`, other added tokens as written,
        vocabulary tokens through the byte-level table or as SentencePiece pieces."""
        tid = self._check_id(token_id)
        if tid >= self._n_tok:
            return b""
        if tid in self._added:
            return self._added[tid].encode("utf-8") if special or tid not in self._special else b""
        text = self._hf.id_to_token(tid) or ""
        if self._byte_level:
            out = bytearray()
            for ch in text:
                b = self._char_to_byte.get(ch)
                out += bytes([b]) if b is not None else ch.encode("utf-8")
            return bytes(out)
        if self._byte_fallback and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            try:
                return bytes([int(text[3:5], 16)])
            except ValueError:
                pass
        return text.replace(_SPACE, " ").encode("utf-8")

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        return decode_pieces(self, ids, special)

    def detokenizer(self, special: bool = False) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self, special)  # type: ignore[arg-type]
