-- Orders per calendar day (the order's `ordered_on` date): volume, distinct customers, items
-- and revenue of the orders not cancelled.
select
    ordered_on,
    count(*) as order_count,
    count(distinct customer_id) as customer_count,
    sum(case when status = 'cancelled' then 1 else 0 end) as cancelled_count,
    sum(case when status <> 'cancelled' then quantity else 0 end) as items,
    cast(
        sum(case when status <> 'cancelled' then quantity * unit_price else 0 end)
        as decimal(18, 2)
    ) as revenue
from {{ source('inventory', 'orders') }}
group by ordered_on
