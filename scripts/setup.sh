#!/usr/bin/env bash
# Installs whatever is missing on a fresh machine: Debian packages, a virtualenv in .venv and the
# project (editable, with dev extras). Idempotent and quick when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
APT_PACKAGES=(python3-venv)   # later issues add postgresql, mariadb-server, redis-server here

need_apt=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need_apt+=("$pkg")
done
# python3-venv is only needed when the interpreter cannot create a venv by itself.
if [ ${#need_apt[@]} -gt 0 ] && [ "${need_apt[*]}" = "python3-venv" ] && "$PY" -m venv --help >/dev/null 2>&1; then
  need_apt=()
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating virtualenv .venv"
  "$PY" -m venv .venv
fi

stamp=.venv/.cdc-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing the project into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[dev]'
  touch "$stamp"
fi
