"""The compiled parts of cdc_platform: the binlog rows decoder (capture/binlog/_rowcodec.c) and
the snapshot chunk reader (capture/snapshot/_rawrows.c, linked with libmariadb, the client library
mysqlclient is built against), which share the Arrow buffers of capture/_arrowbuf.h.

Everything else is declared in pyproject.toml; setuptools reads both. ``pip install -e .``
builds the extensions in place; scripts/bootstrap.sh rebuilds them when their C sources change
(``python setup.py build_ext --inplace``). Without them the engine decodes rows with
mysql-replication alone and the reader reads chunks through mysqlclient's rows (slower, same
values): see capture/binlog/rowcodec.py and capture/snapshot/native.py.
"""

import shlex
import subprocess

from setuptools import Extension, setup

_WARNINGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
             "-Wno-missing-field-initializers"]


def _libmariadb() -> tuple[list[str], list[str]]:
    """Compile and link flags of Debian's libmariadb-dev (pkg-config, else mariadb_config)."""
    for command in (["pkg-config", "--cflags", "--libs", "libmariadb"],
                    ["mariadb_config", "--include", "--libs"]):
        try:
            flags = shlex.split(subprocess.run(command, capture_output=True, text=True,
                                               check=True).stdout)
        except (OSError, subprocess.CalledProcessError):
            continue
        return ([f for f in flags if f.startswith("-I")],
                [f for f in flags if not f.startswith("-I")])
    return ["-I/usr/include/mariadb"], ["-lmariadb"]


_cflags, _libs = _libmariadb()

# Both extensions fill Arrow buffers with the one implementation of capture/_arrowbuf.h:
# ``depends`` makes build_ext rebuild them when it changes.
_ARROWBUF = ["cdc_platform/capture/_arrowbuf.h"]

setup(ext_modules=[
    Extension("cdc_platform.capture.binlog._rowcodec",
              ["cdc_platform/capture/binlog/_rowcodec.c"],
              depends=_ARROWBUF, extra_compile_args=_WARNINGS),
    Extension("cdc_platform.capture.snapshot._rawrows",
              ["cdc_platform/capture/snapshot/_rawrows.c"], depends=_ARROWBUF,
              extra_compile_args=_WARNINGS + _cflags, extra_link_args=_libs),
])
