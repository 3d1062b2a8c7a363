"""llama.cpp's own tokenizer test data: its vocabulary-only GGUFs (models/ggml-vocab-*.gguf) and the
test vectors beside them (.inp: texts separated by a marker line, .out: each text's ids, the files
llama.cpp's tests/test-tokenizer-0 reads), and its real chat templates (models/templates/*.jinja),
taken from the llama.cpp that the installed llama-cpp-python vendors: its source distribution,
fetched once with pip into a cache folder."""
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SEPARATOR = "\n__ggml_vocab_test__\n"  # between the texts of a .inp file


def vocab_dir() -> Path:
    """The folder holding ggml-vocab-*.gguf{,.inp,.out} (and templates/, llama.cpp's
    models/templates), fetched on first use (INFER_TEST_CACHE, default ~/.cache/infer-tests, keeps it)."""
    version = importlib.metadata.version("llama-cpp-python")
    root = Path(os.environ.get("INFER_TEST_CACHE") or Path.home() / ".cache" / "infer-tests")
    out = root / f"llama-cpp-python-{version}-models"
    if (out / ".complete").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={version}", "--no-deps",
                        "--no-binary", ":all:", "-q", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        part = Path(tmp) / "vocab"
        (part / "templates").mkdir(parents=True)
        with tarfile.open(sdist) as tf:
            for member in tf.getmembers():
                name = member.name.rsplit("/", 1)[-1]
                if not member.isfile():
                    continue
                if "/vendor/llama.cpp/models/templates/" in member.name and name.endswith(".jinja"):
                    dest = part / "templates" / name
                elif "/vendor/llama.cpp/models/" in member.name and name.startswith("ggml-vocab-"):
                    dest = part / name
                else:
                    continue
                with tf.extractfile(member) as src:
                    dest.write_bytes(src.read())
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():  # a partial copy of an interrupted run
            shutil.rmtree(out)
        part.rename(out)
    (out / ".complete").touch()
    return out


def chat_template(name: str) -> Path:
    """One of llama.cpp's real chat templates (models/templates/NAME)."""
    return vocab_dir() / "templates" / name


def vocab_files() -> list[Path]:
    return sorted(vocab_dir().glob("ggml-vocab-*.gguf"))


def vectors(path: Path) -> list[tuple[str, list[int]]]:
    """(text, ids) of a vocabulary's test vectors (none if it has none), as test-tokenizer-0 reads
    them: texts split at the marker, each line of .out the ids of one text."""
    inp, outp = Path(f"{path}.inp"), Path(f"{path}.out")
    if not inp.exists():
        return []
    raw = inp.read_bytes().decode("utf-8")
    texts, pos = [], 0
    while pos < len(raw):  # a separator at the very end starts no text
        nxt = raw.find(SEPARATOR, pos)
        texts.append(raw[pos:] if nxt < 0 else raw[pos:nxt])
        if nxt < 0:
            break
        pos = nxt + len(SEPARATOR)
    lines = outp.read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":  # getline: a final newline ends the last line, it starts none
        lines.pop()
    if len(lines) != len(texts):
        raise ValueError(f"{inp}: {len(texts)} texts but {len(lines)} lines of ids")
    return [(t, [int(x) for x in line.split()]) for t, line in zip(texts, lines)]
