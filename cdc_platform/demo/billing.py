"""The demo's second source, the `billing` database on its own MariaDB server: invoices for
the inventory customers (``invoices.customer_id`` is an ``inventory.customers.id``, on another
server, so no foreign key), and their payments. The dbt model ``customer_billing`` joins them
to the inventory source's customers.
"""

from __future__ import annotations

import random
from decimal import Decimal

import pymysql

from cdc_platform.demo.inventory import create_database

TABLES = ("invoices", "payments")

SCHEMA = """
CREATE TABLE IF NOT EXISTS {db}.invoices (
  id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer_id INT UNSIGNED NOT NULL,
  issued_on DATE NOT NULL,
  amount DECIMAL(12,2) NOT NULL,
  status ENUM('open','paid','void') NOT NULL DEFAULT 'open',
  KEY (customer_id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS {db}.payments (
  id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  invoice_id INT UNSIGNED NOT NULL,
  paid_at DATETIME(3) NOT NULL,
  amount DECIMAL(12,2) NOT NULL,
  KEY (invoice_id)
) ENGINE=InnoDB
"""


def create_schema(conn: pymysql.Connection, db: str = "billing") -> None:
    create_database(conn, db, SCHEMA)


def load_initial_data(conn: pymysql.Connection, db: str = "billing", customers: int = 2_000,
                      invoices: int = 5_000, seed: int = 13) -> None:
    """Invoices of customers 1..``customers`` (the inventory's), a payment for each paid one."""
    rng = random.Random(seed)
    rows = []
    for _ in range(invoices):
        day = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        rows.append((rng.randint(1, customers), day, Decimal(rng.randint(500, 500_000)) / 100,
                     rng.choice(["open", "paid", "paid", "void"])))
    with conn.cursor() as cur:
        cur.executemany(f"INSERT INTO `{db}`.invoices (customer_id, issued_on, amount, status) "
                        "VALUES (%s,%s,%s,%s)", rows)
        cur.execute(f"INSERT INTO `{db}`.payments (invoice_id, paid_at, amount) "
                    f"SELECT id, TIMESTAMP(issued_on, '12:00:00'), amount FROM `{db}`.invoices "
                    "WHERE status = 'paid'")
    conn.commit()


def write_some(conn: pymysql.Connection, db: str = "billing", customers: int = 2_000,
               transactions: int = 200, seed: int = 17) -> None:
    """Changes while the stream runs: new invoices, invoices paid (invoice and payment in one
    transaction) and voided."""
    rng = random.Random(seed)
    with conn.cursor() as cur:
        for _ in range(transactions):
            kind = rng.random()
            if kind < 0.5:
                cur.execute(f"INSERT INTO `{db}`.invoices (customer_id, issued_on, amount) "
                            "VALUES (%s, CURRENT_DATE, %s)",
                            (rng.randint(1, customers), Decimal(rng.randint(500, 50_000)) / 100))
            elif kind < 0.85:
                cur.execute(f"SELECT id, amount FROM `{db}`.invoices WHERE status = 'open' "
                            "ORDER BY RAND() LIMIT 1")
                found = cur.fetchone()
                if found:
                    cur.execute(f"UPDATE `{db}`.invoices SET status = 'paid' WHERE id = %s",
                                (found[0],))
                    cur.execute(f"INSERT INTO `{db}`.payments (invoice_id, paid_at, amount) "
                                "VALUES (%s, NOW(3), %s)", found)
            else:
                cur.execute(f"UPDATE `{db}`.invoices SET status = 'void' WHERE status = 'open' "
                            "AND id = %s", (rng.randint(1, 5_000),))
            conn.commit()
