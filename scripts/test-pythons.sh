#!/usr/bin/env bash
# `make test-pythons`: the quick lane (`make test-quick`) on each Python version given, each in a venv of its
# own under .venvs/ (gitignored) with the package and its `test` extra installed. Outside CI's run: it
# installs a venv per version. Exits non-zero when a version is missing or its quick lane fails.
set -uo pipefail
cd "$(dirname "$0")/.."

# python3.X itself, else a pyenv build of it (pyenv's shims only run the versions selected in pyenv)
find_python() {
  local version=$1 candidate
  if command -v "python$version" >/dev/null 2>&1 && "python$version" -V >/dev/null 2>&1; then
    command -v "python$version"
    return 0
  fi
  for candidate in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version"*/bin/"python$version"; do
    if [ -x "$candidate" ]; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

failed=()
for version in "$@"; do
  if ! python=$(find_python "$version"); then
    echo "test-pythons: Python $version not found (python$version on PATH or a pyenv build)" >&2
    failed+=("$version: not found")
    continue
  fi
  venv=".venvs/py$version"
  if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" || { failed+=("$version: venv"); continue; }
  fi
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e '.[test]'; then
    failed+=("$version: pip install -e '.[test]'")
    continue
  fi
  echo "test-pythons: $("$venv/bin/python" -V) ($venv): make test-quick"
  make --no-print-directory test-quick PYTHON="$venv/bin/python" || failed+=("$version: quick lane failed")
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'test-pythons: %s\n' "${failed[@]}" >&2
  exit 1
fi
echo "test-pythons: the quick lane passed on Python $*"
