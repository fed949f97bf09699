{#-
  on-run-start hook: make the lake visible in this dbt process's Spark catalog.

  The lake keeps its table metadata in the warehouse, not in a metastore, and dbt's Spark
  session uses an in-memory catalog, so every dbt process starts with an empty catalog. Dagster
  computes, from each target table's current commit, the statements that register it as a view
  `<server>_<db>.<table>` (folding base + deltas exactly as the lake reads them), plus one
  statement per model table already built under the warehouse (so a partial run can ref it), and
  writes them as JSON lines {"seq", "statement"} to the file named by the var `cdc_catalog_file`
  (cdc_platform/lake/catalog.py generates them; cdc_platform/defs/dbt/project.py writes them).
-#}
{% macro cdc_register_lake_tables() %}
  {%- set catalog_file = var('cdc_catalog_file', none) -%}
  {%- if execute and catalog_file -%}
    {#- the text source reads an empty file too (no statements), json would have no columns -#}
    {%- set statements = run_query(
          "select get_json_object(value, '$.statement') from text.`" ~ catalog_file ~ "`"
          ~ " order by cast(get_json_object(value, '$.seq') as int)") -%}
    {%- for row in statements -%}
      {%- do run_query(row[0]) -%}
    {%- endfor -%}
  {%- endif -%}
{% endmacro %}
