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
# Compiled parts: the native rows decoder (cdc_platform/capture/binlog/_rowcodec.c) and mysqlclient
# (snapshot chunk reads; no Linux wheel, so pip builds it against Debian's libmariadb-dev)
# need a C compiler, Python's headers and pkg-config.
PYTHON="${PYTHON:-python3}"
dpkg -s libmariadb-dev >/dev/null 2>&1 || need_apt+=(libmariadb-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
py_include="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[ -f "${py_include}/Python.h" ] || need_apt+=(python3-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

stamp=".venv/.installed-$(cat pyproject.toml setup.py | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
  echo "bootstrap: installing Python dependencies into .venv (first run takes a few minutes)"
  .venv/bin/pip install -q --disable-pip-version-check -e '.[dev]'
  rm -f .venv/.installed-*
  touch "$stamp"
fi
# The editable install built the extensions in place; rebuild them whenever a source changed.
ext_sources="cdc_platform/capture/binlog/_rowcodec.c cdc_platform/capture/snapshot/_rawrows.c cdc_platform/capture/_arrowbuf.h setup.py"
ext_stamp="build/.extensions-$(cat $ext_sources | sha1sum | cut -c1-12)"
if [ ! -f "$ext_stamp" ] || ! .venv/bin/python -c \
    'import cdc_platform.capture.binlog._rowcodec, cdc_platform.capture.snapshot._rawrows' 2>/dev/null; then
  echo "bootstrap: building the native rows decoder and chunk reader (capture/binlog/_rowcodec.c, capture/snapshot/_rawrows.c)"
  .venv/bin/python setup.py -q build_ext --inplace >/dev/null
  mkdir -p build && rm -f build/.rowcodec-* build/.extensions-*
  touch "$ext_stamp"
fi

# The Iceberg runtime jar must be the complete one (1.0.3 of the wheel ships a broken jar).
ICEBERG_JAR_SHA256=c562d482dcd16b666e808b755469fbc4b2604284b41622c9d87e2c02b7cc6c5f
jar="$(.venv/bin/python -c 'from cdc_platform.lake.iceberg import iceberg_jar; print(iceberg_jar())')"
if ! echo "${ICEBERG_JAR_SHA256}  ${jar}" | sha256sum --check --status; then
  echo "bootstrap: ${jar} does not have sha256 ${ICEBERG_JAR_SHA256}; reinstall snowpark-connect-deps-iceberg==1.0.2" >&2
  exit 1
fi
