"""The one compiled part of cdc_platform: the binlog rows decoder (capture/_rowcodec.c).

Everything else is declared in pyproject.toml; setuptools reads both. ``pip install -e .``
builds the extension in place; scripts/bootstrap.sh rebuilds it when the C source changes
(``python setup.py build_ext --inplace``). Without it the engine decodes rows with
mysql-replication alone (slower, same values): see capture/rowcodec.py.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("cdc_platform.capture._rowcodec", ["cdc_platform/capture/_rowcodec.c"],
              extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                  "-Wno-missing-field-initializers"]),
])
