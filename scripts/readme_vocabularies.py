"""The README's list of supported vocabularies, written from the tables the tokenizer runs on
(engine/tokenizer.py's VOCAB_TYPES, engine/pretokenizers.py's PRE_TOKENIZERS), so it cannot drift
from them; tests/test_vocabularies.py checks the README holds exactly this.

    python scripts/readme_vocabularies.py          # rewrite the README's block in place
"""
from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
BEGIN = "<!-- vocabularies: written by scripts/readme_vocabularies.py from the tokenizer's tables -->"
END = "<!-- /vocabularies -->"


def block() -> str:
    from infer.engine.pretokenizers import PRE_TOKENIZERS
    from infer.engine.tokenizer import VOCAB_TYPES

    by_type: dict[str, list[str]] = {}
    for model, vt in VOCAB_TYPES.items():
        by_type.setdefault(vt.name, []).append(f"`{model}`")
    types = "; ".join(f"{name}: {', '.join(models)}" for name, models in by_type.items())
    pres = ", ".join(f"`{n}`" for n in sorted(PRE_TOKENIZERS))
    return "\n".join([
        BEGIN,
        f"Vocabulary types (`tokenizer.ggml.model`, by llama.cpp's type): {types}.",
        "",
        f"BPE pre-tokenizers (`tokenizer.ggml.pre`, all {len(PRE_TOKENIZERS)} that llama.cpp knows): {pres}.",
        END,
    ])


def main() -> int:
    text = README.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    README.write_text(text[:start] + block() + text[end:], encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
