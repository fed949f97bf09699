-- One row per inventory customer with what billing invoiced and was paid: the inventory
-- source's customers joined to the billing source's invoices and payments (two servers, one
-- model). Enabled when the deployment captures a billing source (var cdc_billing_server_name).
{{ config(enabled=var('cdc_billing_server_name', '') != '') }}

with invoices as (
    select
        customer_id,
        count(*) as invoice_count,
        sum(case when status <> 'void' then amount else 0 end) as invoiced,
        sum(case when status = 'open' then amount else 0 end) as open_amount
    from {{ source('billing', 'invoices') }}
    group by customer_id
),

paid as (
    select
        invoices.customer_id,
        sum(payments.amount) as paid
    from {{ source('billing', 'payments') }} as payments
    inner join {{ source('billing', 'invoices') }} as invoices
        on invoices.id = payments.invoice_id
    group by invoices.customer_id
)

select
    customers.id as customer_id,
    customers.email,
    customers.tier,
    coalesce(invoices.invoice_count, 0) as invoice_count,
    cast(coalesce(invoices.invoiced, 0) as decimal(18, 2)) as invoiced,
    cast(coalesce(invoices.open_amount, 0) as decimal(18, 2)) as open_amount,
    cast(coalesce(paid.paid, 0) as decimal(18, 2)) as paid
from {{ source('inventory', 'customers') }} as customers
left join invoices on invoices.customer_id = customers.id
left join paid on paid.customer_id = customers.id
