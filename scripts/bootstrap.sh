#!/usr/bin/env bash
# Idempotent bootstrap for `make demo` / `make test` on a fresh machine:
# Debian packages (MariaDB server, Java 17) if missing, then .venv with the package installed.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || need_apt+=(mariadb-server)
command -v mariadb-install-db >/dev/null 2>&1 || need_apt+=(mariadb-server)
if ! command -v java >/dev/null 2>&1 || ! java -version 2>&1 | grep -q 'version "1[7-9]\|version "2'; then
  need_apt+=(openjdk-17-jre-headless)
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  echo "bootstrap: installing Python dependencies into .venv (first run takes a few minutes)"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
