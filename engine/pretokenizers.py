r"""Every pre-tokenizer llama.cpp knows for its BPE vocabularies, as data: tokenizer.ggml.pre names ->
llama.cpp's pre-tokenizer type and the flags its loader sets for the name (llama_vocab::impl::load),
each type's split regexes as llama.cpp writes them (the llm_tokenizer_bpe constructor), and how
those regexes are read here: as Oniguruma reads them (in Hugging Face `tokenizers`, bpe.py, and
as regex_split.py runs them), rewritten where llama.cpp's own regex handling means something else
(onig_regex).

llama.cpp runs a regex either through a hand-written matcher (GPT-2, Llama 3, Qwen 2/3.5 and a few
others: unicode_regex_split_custom, which implement their regexes) or through std::regex over a
"collapsed" text where each non-ASCII character stands for its Unicode category; so \p{Lu},
\p{Ll}, ... all mean any letter there, \d and [0-9] ASCII digits, and $ the end of the piece. Its
category tables are Unicode 15.1's, where Oniguruma knows newer characters: those are taken out
of \p{L}, \p{N}, \p{M}, \p{P} and \p{S} (they are unassigned to llama.cpp).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class PreTokenizer:
    """One tokenizer.ggml.pre name: llama.cpp's pre-tokenizer type and the flags it sets."""

    type: str  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_* (without the prefix): the key of _REGEXES
    ignore_merges: bool = False  # a word already in the vocabulary is kept whole
    clean_spaces: bool = True  # the detokenizer removes spaces before punctuation
    add_bos: bool = False  # default when the GGUF has no add_bos_token key
    escape_whitespaces: bool = False  # spaces are written as U+2581 before the split (Gemma 4's BPE)
    byte_encode: bool = True  # GPT-2's byte-to-character mapping (False: raw UTF-8, <0xXX> byte tokens)
    add_sep: bool = False  # what llama_vocab_get_add_sep reports (RoBERTa-style; encode adds none)
    no_bos: bool = False  # llama.cpp drops the BPE default BOS id (ChatGLM): only the GGUF's key sets one
    lowercase: bool = True  # the "whitespace" model's default (tokenizer.ggml.normalizer.lowercase wins)

    @property
    def regexes(self) -> tuple[str, ...]:
        return _REGEXES[self.type]


_REGEXES: MappingProxyType[str, tuple[str, ...]] = MappingProxyType({
    'LLAMA3': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'JAIS2': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}",),
    'DBRX': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'SMAUG': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'DEEPSEEK_LLM': ('[\r\n]', '\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+', '\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+', '\\s+$', '[一-龥ࠀ-一가-\ud7ff]+', '\\p{N}+'),
    'DEEPSEEK3_LLM': ('\\p{N}{1,3}', '[一-龥\u3040-ゟ゠-ヿ]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+'),
    'HUNYUAN_DENSE': ('\\p{N}{1,3}', '[一-龥\u3040-ゟ゠-ヿ]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+'),
    'JOYAI_LLM': ('\\p{N}{1,3}', '[一-龥\u3040-ゟ゠-ヿ]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+'),
    'HY_V4': ('\\p{N}{1,3}', '[一-龥\u3040-ゟ゠-ヿ]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+'),
    'SPARK2_5': ('\\p{N}{1,3}', '[一-龥\u3040-ゟ゠-ヿ]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+', '\\p{N}'),
    'YOUTU': ('[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u3040-ゟ゠-ヿ]+', "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    'DEEPSEEK_CODER': ('[\r\n]', '\\s?\\p{L}+', '\\s?\\p{P}+', '[一-龥ࠀ-一가-\ud7ff]+', '\\p{N}'),
    'FALCON': ('[\\p{P}\\$\\+<=>\\^~\\|`]+', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", '[0-9][0-9][0-9]'),
    'STARCODER': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'REFACT': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'COMMAND_R': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'SMOLLM': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'CODESHELL': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'EXAONE': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'MINERVA': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'MELLUM2': ('\\p{N}', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'GPT2': ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    'MPT': ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    'OLMO': ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    'JAIS': ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    'TRILLION': ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    'GRANITE_DOCLING': ("'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",),
    'STABLELM2': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'QWEN2': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'HUNYUAN': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'SOLAR_OPEN': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'QWEN35': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'PORO': (' ?[^(\\s|.,!?…。，、।۔،)]+',),
    'BLOOM': (' ?[^(\\s|.,!?…。，、।۔،)]+',),
    'GPT3_FINNISH': (' ?[^(\\s|.,!?…。，、।۔،)]+',),
    'CHATGLM4': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'VIKING': (' ?[^(\\s|.,!?…。，、।۔،)]+', '\\p{N}'),
    'TEKKEN': ('[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',),
    'CHAMELEON': ('<sentinel:[0-9]+>', '(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z', '([\\t\\n]|    |  )', '\\p{N}', '[\\p{P}!-/:-@\\[-`{-~]', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"),
    'GPT4O': ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'MINIMAX_M2': ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'GRANITE_EMB_MULTI': ("[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'TINY_AYA': ('\\d{1,3}(?=(?:\\d{3})*\\b)', "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    'KIMI_K2': ('\\p{Han}+',),
    'SUPERBPE': ('\\p{N}+', '(?=(\\d{3})+(?!\\d))'),
    'BAILINGMOE': ("'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    'SEED_CODER': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'UFAKZEKA': ('[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+',),
    'GROK_2': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",),
    'AFMOE': ('\\p{AFMoE_digits}', '[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff가-\ud7afᄀ-ᇿ]+', '[!"#$%&\'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+'),
    'LAGUNA': ('[^\\n]+|[\\n]+', "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    'EXAONE_MOE': ("(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",),
    'GEMMA4': ('[^\\n]+|[\\n]+',),
    'SARVAM_MOE': ('[^\\n]+|[\\n]+',),
    'MINICPM5': ('\\p{N}{1,3}', "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
    'WHITESPACE': ('\\S+',),
    'DEFAULT': ('[\\p{P}\\$\\+<=>\\^~\\|]+', "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)", '\\p{N}+', '[0-9][0-9][0-9]'),
})

PRE_TOKENIZERS: MappingProxyType[str, PreTokenizer] = MappingProxyType({
    'default': PreTokenizer('DEFAULT'),
    'minicpm5': PreTokenizer('MINICPM5', ignore_merges=True),
    'llama3': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'llama-v3': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'llama-bpe': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'falcon3': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'falcon-h1': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'pixtral': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'midm-2.0': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'lfm2': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'jina-v5-nano': PreTokenizer('LLAMA3', ignore_merges=True, add_bos=True),
    'deepseek-llm': PreTokenizer('DEEPSEEK_LLM', clean_spaces=False),
    'deepseek-coder': PreTokenizer('DEEPSEEK_CODER', clean_spaces=False),
    'deepseek-v3': PreTokenizer('DEEPSEEK3_LLM', clean_spaces=False),
    'spark2_5': PreTokenizer('SPARK2_5', clean_spaces=False),
    'youtu': PreTokenizer('YOUTU', clean_spaces=False, ignore_merges=True),
    'falcon': PreTokenizer('FALCON'),
    'mpt': PreTokenizer('MPT'),
    'starcoder': PreTokenizer('STARCODER'),
    'gpt-2': PreTokenizer('GPT2'),
    'phi-2': PreTokenizer('GPT2'),
    'jina-es': PreTokenizer('GPT2'),
    'jina-de': PreTokenizer('GPT2'),
    'gigachat': PreTokenizer('GPT2'),
    'jina-v2-es': PreTokenizer('GPT2'),
    'jina-v2-de': PreTokenizer('GPT2'),
    'a.x-4.0': PreTokenizer('GPT2'),
    'mellum': PreTokenizer('GPT2'),
    'modern-bert': PreTokenizer('GPT2'),
    'jais-2': PreTokenizer('JAIS2'),
    'gemma4': PreTokenizer('GEMMA4', escape_whitespaces=True, byte_encode=False),
    'granite-embed-multi-311m': PreTokenizer('GEMMA4', escape_whitespaces=True, byte_encode=False),
    'sarvam-moe': PreTokenizer('SARVAM_MOE', escape_whitespaces=True, clean_spaces=False, byte_encode=False),
    'jina-v1-en': PreTokenizer('GPT2', add_sep=True),
    'jina-v2-code': PreTokenizer('GPT2', add_sep=True),
    'roberta-bpe': PreTokenizer('GPT2', add_sep=True),
    'whitespace': PreTokenizer('WHITESPACE', lowercase=False, byte_encode=False),
    'refact': PreTokenizer('REFACT'),
    'command-r': PreTokenizer('COMMAND_R', clean_spaces=False),
    'qwen2': PreTokenizer('QWEN2', clean_spaces=False),
    'deepseek-r1-qwen': PreTokenizer('QWEN2', clean_spaces=False),
    'kormo': PreTokenizer('QWEN2', clean_spaces=False),
    'f2llmv2': PreTokenizer('QWEN2', clean_spaces=False),
    'qwen35': PreTokenizer('QWEN35', clean_spaces=False),
    'stablelm2': PreTokenizer('STABLELM2'),
    'olmo': PreTokenizer('OLMO'),
    'dbrx': PreTokenizer('DBRX'),
    'smaug-bpe': PreTokenizer('SMAUG'),
    'poro-chat': PreTokenizer('PORO', clean_spaces=False),
    'chatglm-bpe': PreTokenizer('CHATGLM4', no_bos=True),
    'glm4': PreTokenizer('CHATGLM4', no_bos=True, ignore_merges=True),
    'glm5': PreTokenizer('CHATGLM4', no_bos=True, ignore_merges=True),
    'viking': PreTokenizer('VIKING', clean_spaces=False),
    'jais': PreTokenizer('JAIS'),
    'tekken': PreTokenizer('TEKKEN', clean_spaces=False, ignore_merges=True, add_bos=True),
    'smollm': PreTokenizer('SMOLLM', clean_spaces=False),
    'codeshell': PreTokenizer('CODESHELL'),
    'bloom': PreTokenizer('BLOOM'),
    'gpt3-finnish': PreTokenizer('GPT3_FINNISH'),
    'exaone': PreTokenizer('EXAONE'),
    'exaone4': PreTokenizer('GPT2'),
    'exaone-moe': PreTokenizer('EXAONE_MOE'),
    'chameleon': PreTokenizer('CHAMELEON', add_bos=True, clean_spaces=False),
    'minerva-7b': PreTokenizer('MINERVA'),
    'megrez': PreTokenizer('QWEN2'),
    'gpt-4o': PreTokenizer('GPT4O', clean_spaces=False),
    'llama4': PreTokenizer('GPT4O', clean_spaces=False),
    'kanana2': PreTokenizer('GPT4O', clean_spaces=False),
    'talkie': PreTokenizer('GPT4O', clean_spaces=False),
    'granite-embed-multi-97m': PreTokenizer('GRANITE_EMB_MULTI', clean_spaces=False, ignore_merges=True),
    'tiny_aya': PreTokenizer('TINY_AYA', clean_spaces=False),
    'cohere2moe': PreTokenizer('TINY_AYA', clean_spaces=False),
    'superbpe': PreTokenizer('SUPERBPE', clean_spaces=False),
    'trillion': PreTokenizer('TRILLION', clean_spaces=False),
    'granite-docling': PreTokenizer('GRANITE_DOCLING', clean_spaces=False),
    'bailingmoe': PreTokenizer('BAILINGMOE', clean_spaces=False),
    'bailingmoe2': PreTokenizer('BAILINGMOE', clean_spaces=False),
    'llada-moe': PreTokenizer('BAILINGMOE', clean_spaces=False),
    'seed-coder': PreTokenizer('SEED_CODER', clean_spaces=False),
    'hunyuan': PreTokenizer('HUNYUAN', clean_spaces=False),
    'hunyuan-dense': PreTokenizer('HUNYUAN_DENSE', clean_spaces=False),
    'hy_v4': PreTokenizer('HY_V4', clean_spaces=False),
    'joyai-llm': PreTokenizer('JOYAI_LLM', clean_spaces=False),
    'kimi-k2': PreTokenizer('KIMI_K2', clean_spaces=False),
    'ufakzeka': PreTokenizer('UFAKZEKA', clean_spaces=False),
    'grok-2': PreTokenizer('GROK_2', clean_spaces=False),
    'afmoe': PreTokenizer('AFMOE', clean_spaces=False),
    'laguna': PreTokenizer('LAGUNA', clean_spaces=False),
    'minimax-m2': PreTokenizer('MINIMAX_M2', clean_spaces=False),
    'solar-open': PreTokenizer('SOLAR_OPEN', clean_spaces=False),
    'mellum2': PreTokenizer('MELLUM2'),
})


# The regexes llama.cpp runs with a hand-written matcher that implements them (the regex itself,
# with Unicode categories as its tables have them), and those whose matcher does something else.
_CUSTOM_AS_WRITTEN = frozenset({
    _REGEXES["GPT2"][0], _REGEXES["LLAMA3"][0], _REGEXES["QWEN2"][0], _REGEXES["QWEN35"][0],
    _REGEXES["GEMMA4"][0],
})
# Kimi-K2's matcher (unicode_regex_split_custom_kimi_k2): the tokenizer's regex, Han characters
# apart and every letter alike
_KIMI_K2 = (r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+(?:'[sS]|'[tT]|'[mM]|'[dD]|'[rR][eE]|'[vV][eE]|'[lL][lL])?"
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DIGIT_GROUPS = "afmoe-digits"  # llama.cpp's digit grouping matcher (split_digit_groups), not a regex
_MATCHERS = MappingProxyType({
    "\\p{Han}+": _KIMI_K2,
    "\\p{AFMoE_digits}": DIGIT_GROUPS,
    "\\d{1,3}(?=(?:\\d{3})*\\b)": DIGIT_GROUPS,  # tiny_aya: llama.cpp hands it to the same matcher
})

# Characters of Unicode 16 and 17 that Oniguruma puts in these categories and llama.cpp's
# Unicode 15.1 tables leave unassigned (computed from llama.cpp's unicode-data.cpp against
# `tokenizers`' Oniguruma, every code point)
_NEWER = (
    ("L", r"\x{1C89}-\x{1C8A}\x{A7CB}-\x{A7CD}\x{A7DA}-\x{A7DC}\x{105C0}-\x{105F3}\x{10D4A}-\x{10D65}"
         r"\x{10D6F}-\x{10D85}\x{10EC2}-\x{10EC4}\x{11380}-\x{11389}\x{1138B}\x{1138E}"
         r"\x{11390}-\x{113B5}\x{113B7}\x{113D1}\x{113D3}\x{11BC0}-\x{11BE0}\x{13460}-\x{143FA}"
         r"\x{16100}-\x{1611D}\x{16D40}-\x{16D6C}\x{18CFF}\x{1E5D0}-\x{1E5ED}\x{1E5F0}"),
    ("N", r"\x{10D40}-\x{10D49}\x{116D0}-\x{116E3}\x{11BF0}-\x{11BF9}\x{16130}-\x{16139}"
         r"\x{16D70}-\x{16D79}\x{1CCF0}-\x{1CCF9}\x{1E5F1}-\x{1E5FA}"),
    ("M", r"\x{897}\x{10D69}-\x{10D6D}\x{10EFC}\x{113B8}-\x{113C0}\x{113C2}\x{113C5}\x{113C7}-\x{113CA}"
         r"\x{113CC}-\x{113D0}\x{113D2}\x{113E1}-\x{113E2}\x{11F5A}\x{1611E}-\x{1612F}\x{1E5EE}-\x{1E5EF}"),
    ("P", r"\x{1B4E}-\x{1B4F}\x{1B7F}\x{10D6E}\x{113D4}-\x{113D5}\x{113D7}-\x{113D8}\x{11BE1}"
         r"\x{16D6D}-\x{16D6F}\x{1E5FF}"),
    ("S", r"\x{2427}-\x{2429}\x{31E4}-\x{31E5}\x{10D8E}-\x{10D8F}\x{1CC00}-\x{1CCEF}\x{1CD00}-\x{1CEB3}"
         r"\x{1F8B2}-\x{1F8BB}\x{1F8C0}-\x{1F8C1}\x{1FA89}\x{1FA8F}\x{1FABE}\x{1FAC6}\x{1FADC}\x{1FADF}"
         r"\x{1FAE9}\x{1FBCB}-\x{1FBEF}"),
)
_CATEGORIES = re.compile(r"\\p\{(?:L[ultmo]?|N|P|M|S)\}")


def onig_regex(regex: str) -> str:
    r"""`regex` as Oniguruma must read it to split as llama.cpp does (see the module docstring)."""
    regex = _MATCHERS.get(regex, regex)
    if regex not in _CUSTOM_AS_WRITTEN and regex != _KIMI_K2:
        # std::regex (ECMAScript): \d is ASCII digits, $ the end of the piece (no end-of-line);
        # over collapsed text (where the regex names categories) every letter subcategory is a letter
        regex = regex.replace(r"\d", "[0-9]")
        regex = re.sub(r"(?<!\\)\$$", r"\\z", regex)
        if _CATEGORIES.search(regex):
            regex = re.sub(r"\\p\{L[ultmo]\}", r"\\p{L}", regex)
        else:  # std::wregex sees non-ASCII whitespace as \v: no class of literal characters holds it
            regex = _without_wide_spaces(regex)
    for cat, newer in _NEWER:
        regex = regex.replace(rf"\p{{{cat}}}", rf"[\p{{{cat}}}&&[^{newer}]]")
    return regex


_WIDE_SPACES = r"\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000}"


def _without_wide_spaces(regex: str) -> str:
    r"""Each positive [...] class of `regex` less the non-ASCII whitespace (negated ones already
    leave it to \s, as llama.cpp's \v)."""
    out, i = [], 0
    while i < len(regex):
        c = regex[i]
        if c == "\\":
            out.append(regex[i:i + 2])
            i += 2
            continue
        if c != "[":
            out.append(c)
            i += 1
            continue
        j = i + 1
        if j < len(regex) and regex[j] == "^":
            j += 1
        j += 1  # a ']' right after '[' or '[^' is a literal
        while regex[j] != "]":
            j += 2 if regex[j] == "\\" else 1
        body = regex[i + 1:j]
        out.append(f"[{body}]" if body.startswith("^") else f"[{body}&&[^{_WIDE_SPACES}]]")
        i = j + 1
    return "".join(out)


def split_digit_groups(text: str) -> list[tuple[int, int]]:
    """llama.cpp's digit grouping (unicode_regex_split_custom_afmoe) over one piece, as (start, end)
    spans: every run of numbers in threes from its end, the first group (1-2 digits where the run's
    length is not a multiple of 3, else 3) together with whatever precedes it since the last group,
    and the rest of the piece after the last run. Numbers are Unicode's N categories (llama.cpp's
    tables are Unicode 15.1, Python's may be older or newer by a few characters)."""
    spans, prev, pos, n = [], 0, 0, len(text)
    while pos < n:
        if unicodedata.category(text[pos])[0] != "N":
            pos += 1
            continue
        start = pos
        while pos < n and unicodedata.category(text[pos])[0] == "N":
            pos += 1
        cur = start + (pos - start) % 3
        if cur > start:
            spans.append((prev, cur))
            prev = cur
        while cur < pos:
            spans.append((prev, cur + 3))
            prev = cur = cur + 3
    if prev < n:
        spans.append((prev, n))
    return spans
