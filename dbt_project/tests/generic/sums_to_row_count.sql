{#- Fails when the column's total differs from the number of rows of `of`: an aggregate that
    lost or double-counted rows of its input. -#}
{% test sums_to_row_count(model, column_name, of) %}
with total as (
    select coalesce(sum({{ column_name }}), 0) as n from {{ model }}
),

expected as (
    select count(*) as n from {{ of }}
)

select total.n as total, expected.n as expected
from total
cross join expected
where total.n <> expected.n
{% endtest %}
