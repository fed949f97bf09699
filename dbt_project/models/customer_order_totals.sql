-- One row per customer: how much they ordered. Cancelled orders count as orders but add no
-- items or revenue.
with orders as (
    select
        customer_id,
        status,
        quantity,
        quantity * unit_price as amount,
        ordered_at
    from {{ source('inventory', 'orders') }}
),

per_customer as (
    select
        customer_id,
        count(*) as order_count,
        sum(case when status = 'cancelled' then 1 else 0 end) as cancelled_count,
        sum(case when status <> 'cancelled' then quantity else 0 end) as items,
        sum(case when status <> 'cancelled' then amount else 0 end) as revenue,
        min(ordered_at) as first_ordered_at,
        max(ordered_at) as last_ordered_at
    from orders
    group by customer_id
)

select
    customers.id as customer_id,
    customers.email,
    customers.tier,
    coalesce(per_customer.order_count, 0) as order_count,
    coalesce(per_customer.cancelled_count, 0) as cancelled_count,
    coalesce(per_customer.items, 0) as items,
    cast(coalesce(per_customer.revenue, 0) as decimal(18, 2)) as revenue,
    per_customer.first_ordered_at,
    per_customer.last_ordered_at
from {{ source('inventory', 'customers') }} as customers
left join per_customer on per_customer.customer_id = customers.id
