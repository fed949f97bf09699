"""The one package that touches lake tables: Apache Iceberg tables in a catalog, through Spark
(``lake``, ``table``, and the functions of ``commit``, ``schema`` and ``maintenance`` that take a
table) or without it (``hadoop``, ``rest``, ``row_delta``, ``upkeep``).

Its modules name the concepts; every name is imported from the module that defines it.
"""
