#!/usr/bin/env bash
# Builds llama.cpp's native llama-bench and llama-server -- the references for speed and serving --
# from the llama.cpp that llama-cpp-python vendors (its sdist's vendor/llama.cpp), once, into a
# cache outside the repository.  Prints the folder holding the two programs.
#
#   bash scripts/build_llama_bench.sh            # the installed llama-cpp-python's version
#   LLAMA_CPP_PYTHON_VERSION=0.3.36 bash scripts/build_llama_bench.sh
#
# Static, native-ISA (GGML_NATIVE) release builds, as llama-cpp-python builds its own library
# on this machine; about 7 minutes on 2 cores.  The cache: $INFER_BENCH_CACHE, else
# ~/.cache/infer-bench.  A finished build is moved into place whole, so an interrupted one
# leaves nothing that looks complete.
set -euo pipefail
ver=${LLAMA_CPP_PYTHON_VERSION:-$(python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")}
cache=${INFER_BENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infer-bench}
dest="$cache/llama.cpp-$ver"
if [ -x "$dest/bin/llama-bench" ] && [ -x "$dest/bin/llama-server" ]; then
    echo "$dest/bin"
    exit 0
fi
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pip download -q --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$ver" >&2
tar -xzf "$tmp/llama_cpp_python-$ver.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-$ver/vendor/llama.cpp"
cmake -S "$src" -B "$tmp/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$tmp/build" --target llama-bench llama-server -j"$(nproc)" >&2
mkdir -p "$tmp/out/bin"
cp "$tmp/build/bin/llama-bench" "$tmp/build/bin/llama-server" "$tmp/out/bin/"
rm -rf "$dest"
mv "$tmp/out" "$dest"
echo "$dest/bin"
