#!/usr/bin/env bash
# Idempotent bootstrap for `make demo` / `make test` on a fresh machine:
# Debian packages (MariaDB server, Java 17, Prometheus) if missing, then .venv with the package installed.
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
# Prometheus's server and promtool: the alert rules' unit tests (`promtool test rules`) and the
# monitoring integration test, which scrapes a real engine and applier.
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
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
jar="$(.venv/bin/python -c 'from cdc_platform.lake.iceberg.catalog import iceberg_jar; print(iceberg_jar())')"
if ! echo "${ICEBERG_JAR_SHA256}  ${jar}" | sha256sum --check --status; then
  echo "bootstrap: ${jar} does not have sha256 ${ICEBERG_JAR_SHA256}; reinstall snowpark-connect-deps-iceberg==1.0.2" >&2
  exit 1
fi

# Object storage (S3) jars for the lake's Spark sessions: hadoop-aws (s3a:// landing-zone reads, AWS
# SDK v1) and the AWS SDK v2 modules Iceberg's S3FileIO and the REST catalog's SigV4 signer need.
# Maven Central is not reachable here, so they come from the PyPI wheel bodo-iceberg-connector
# (downloaded, never installed: it pins pyarrow 22), only the jars below, checksum-verified, into
# the directory lake.s3.s3_jars() reads. The wheel's own Iceberg and Hadoop jars stay out (the
# session uses snowpark-connect-deps-iceberg's Iceberg runtime and pyspark's hadoop-client 3.3.4).
# Production images take the Maven Central artifacts instead (docs/iceberg.md).
S3_JARS_WHEEL="bodo-iceberg-connector==2026.10"
S3_JARS_DIR=".venv/share/cdc-platform/s3-jars"
S3_JARS_SHA256="
d160f1216749353360880359ec1725cef4bec442eaca477f3a98f6eb894fb62e annotations-2.29.26.jar
13d58ff12f66df140cfcad17781f1af9d882a1bb839247bab18a974c89de0949 apache-client-2.29.26.jar
623334705d1130353bb64cb7a906b916e5b3711afcd43f8354dd761780b28f0a arns-2.29.26.jar
3597fb8e42b18c5706fbeea38331022c4c57994e8cee30ad69345d0af7576408 auth-2.29.26.jar
f211a8bdbac010c16be6d3aa2d104a6f5bcff8315eab3035ce9f1149347146fa aws-core-2.29.26.jar
002c75b3b4a933d9467f1443683c3f3cdca86c0f57778088963dd2033d94fccb aws-json-protocol-2.29.26.jar
fdfc7eff6f58ab69c3bd83acf8f932ecdd7e52acde3ac194fcf5de8fb6e9833e aws-query-protocol-2.29.26.jar
52318cd5ca191e4b78a82cdf60b1c6a1e4a83b2a01317062156f63b45b272f4f aws-xml-protocol-2.29.26.jar
753612b562bd3108848bec04801aa80ab054531ef1d96545e005370c670cb7fc checksums-2.29.26.jar
d2b9224b0f76a4e4506a31becebb8db904f2a7b78975fbb3911e8cf912aef700 checksums-spi-2.29.26.jar
a422b9973e816f3e888b21758e7ed48416b4bfebd46c89fe5106d94a5c1387af crt-core-2.29.26.jar
3a53cb14905a2a05213a43e74bda37adbd169cfc1d03386fb64143fc2be5782e endpoints-spi-2.29.26.jar
30af1028623034436c8ac473f2d5ac96f43996d4dc1b27c0a2324ced523b339d http-auth-2.29.26.jar
5d8ec7c4a2d407740c4793d2cbc76682e6a9de5f123186d5b068bca5e01cee68 http-auth-aws-2.29.26.jar
4c72064a6c2b555ef9e62da7c35f35e42cd2cbf0e4d87d2d8a91cc8114d4efbc http-auth-spi-2.29.26.jar
af9d60aceaf2136738d8df61c95b89d088f698316de17a1442230983fff754f6 http-client-spi-2.29.26.jar
a0fcd5a76ae8af684f31328b75e8e77dc55fe322b4409022cc5fb328776ca728 identity-spi-2.29.26.jar
f7838c0a4e6fd38a0e1781606da883752ce8b543ebd40b69dec2ff69db86da45 json-utils-2.29.26.jar
6898d489d0679374e55c25271367229b096134609950b2ca55f1993257f5b630 kms-2.29.26.jar
0333df653c6ef5673553931190bab78dc14a102179eb7c390d15ebf5a58e829b metrics-spi-2.29.26.jar
8033fd5847bef28643913e0079bf479040d20b825ac1fe2ef5e61d05cc68995d profiles-2.29.26.jar
ac5d2d4fb17d7dea29751533999d65a4746eeadcfa1c062836314bb02ad33793 protocol-core-2.29.26.jar
f75ca597789b3dac58f61857b9ac2e1034a68fa672db35055a8fb4509e325f28 reactive-streams-1.0.4.jar
f52ec0d58ab62dd113c6196ae22ae0d1d89eeb400a45e4039f0e5a304362a8a0 regions-2.29.26.jar
91ba6ce9f14169d276908f29cf66b1dfee96c51afd562e0a899494e1cf9d211e retries-2.29.26.jar
5c5161c18a1886e4f234a70b410ce2b60cfd237c280fbbcff17889f2323aad9d retries-spi-2.29.26.jar
49d2e0f6f3c5d9ebfbdf490b84883255158de1a3ccb81e11ef39e39e77026c7b s3-2.29.26.jar
21ffd779415d6e28b67de2a29773997bb4e67cd5e3a8b77c7e03dd2564a6cd1e sdk-core-2.29.26.jar
af6e6d22d29b752119176bf3d06c67a331ff9fe0a83aec34b721e4654925cffc sts-2.29.26.jar
82effe7379a181e6d8bb94c75becb9401eedfdef7bc1698dc3c732892fab2eef third-party-jackson-core-2.29.26.jar
bcab120d0d2129faa2d48cecf6034ed6a1f27421e407348f973ca53b0d44ccae utils-2.29.26.jar
42a502ac0343acc5bbbb084a6f3a6379e474bc4f761279beba276d59fecd4713 hadoop-aws-3.3.3.jar
f73e2e38beaa957e66d9306fa909ea18615f2bfb93b1b4fe3366c2b4f7eeb109 aws-java-sdk-core-1.12.382.jar
f52e5f764a307626631cf39fdb421ca5bbd52710d9feac09fe9d3fdb8e640f21 aws-java-sdk-dynamodb-1.12.382.jar
60277a9f95b35cc29ac563db46695c86ea1cf74b98443a59a8b92074cc9ec0d0 aws-java-sdk-kms-1.12.382.jar
ca8df3b4166152210aeca8612d9710fc694e6cbd1b925316d95624291fcae7f5 aws-java-sdk-s3-1.12.382.jar
722941956bce405f0541863dc744558237cc67b77af0630cbe37fb597750ba81 aws-java-sdk-sts-1.12.382.jar
2a8cdb00fb86314bccf8b16ef0efa4c13b306be74cd739f2b639a2f9410d8f76 jmespath-java-1.12.382.jar
"
s3_jars_check() {  # every pinned jar present with its checksum (fast: ~16 MB hashed)
  [ -d "$S3_JARS_DIR" ] && (cd "$S3_JARS_DIR" && echo "$S3_JARS_SHA256" | grep . |
    sed 's/ /  /' | sha256sum --check --strict --status 2>/dev/null)
}
if ! s3_jars_check; then
  echo "bootstrap: extracting the S3 jars (hadoop-aws, AWS SDK) from ${S3_JARS_WHEEL} into ${S3_JARS_DIR}"
  s3_tmp="$(mktemp -d)"
  trap 'rm -rf "$s3_tmp"' EXIT
  # Without PyPI only the S3 tests fail (lake.s3.s3_jars names this step); the rest still runs.
  if .venv/bin/pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      "$S3_JARS_WHEEL" -d "$s3_tmp/wheel"; then
    S3_JARS_SHA256="$S3_JARS_SHA256" .venv/bin/python - "$s3_tmp"/wheel/*.whl "$s3_tmp/jars" <<'PY'
import hashlib, os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
pins = dict(line.split()[::-1] for line in os.environ["S3_JARS_SHA256"].split("\n") if line.strip())
os.makedirs(out)
with zipfile.ZipFile(wheel) as archive:
    for name, digest in pins.items():
        data = archive.read(f"bodo_iceberg_connector/jars/libs/{name}")
        if hashlib.sha256(data).hexdigest() != digest:
            sys.exit(f"bootstrap: {name} in {wheel} does not have sha256 {digest}")
        with open(os.path.join(out, name), "wb") as jar:
            jar.write(data)
PY
    mkdir -p "$(dirname "$S3_JARS_DIR")"
    rm -rf "$S3_JARS_DIR"
    mv "$s3_tmp/jars" "$S3_JARS_DIR"
    s3_jars_check || { echo "bootstrap: ${S3_JARS_DIR} failed its checksums" >&2; exit 1; }
  else
    echo "bootstrap: WARNING: could not download ${S3_JARS_WHEEL}; Spark sessions on S3 miss" \
      "their jars until scripts/bootstrap.sh runs again with PyPI reachable" >&2
  fi
  rm -rf "$s3_tmp"
  trap - EXIT
fi
