-- Current stock by product, with the units promised to open (new or paid, not yet shipped)
-- orders and what remains available.
with open_orders as (
    select
        sku,
        sum(quantity) as units
    from {{ source('inventory', 'orders') }}
    where status in ('new', 'paid')
    group by sku
)

select
    products.sku,
    products.name,
    products.price,
    products.stock,
    products.discontinued = 1 as discontinued,
    coalesce(open_orders.units, 0) as units_on_open_orders,
    products.stock - coalesce(open_orders.units, 0) as units_available,
    cast(products.stock * products.price as decimal(18, 2)) as stock_value
from {{ source('inventory', 'products') }} as products
left join open_orders on open_orders.sku = products.sku
