"""The demo's `inventory` database: schema, initial data and a write workload.

Used by ``make demo`` and by the integration tests (kill -9, reconnect, bench), so the workload
is realistic: single-row and multi-statement transactions, inserts, updates (including ones that
touch many rows), deletes, and transactions that roll back.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import pymysql

SCHEMA = """
CREATE TABLE IF NOT EXISTS {db}.customers (
  id INT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  email VARCHAR(120) NOT NULL,
  full_name VARCHAR(120) CHARACTER SET utf8mb4 NOT NULL,
  password_hash BINARY(32) NULL,
  tier ENUM('free','silver','gold') NOT NULL DEFAULT 'free',
  tags SET('b2b','newsletter','vip') NULL,
  created_at DATETIME(6) NOT NULL,
  updated_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3) ON UPDATE CURRENT_TIMESTAMP(3)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS {db}.products (
  sku VARCHAR(16) NOT NULL PRIMARY KEY,
  name VARCHAR(200) CHARACTER SET utf8mb4 NOT NULL,
  price DECIMAL(10,2) NOT NULL,
  weight_kg FLOAT NULL,
  stock INT NOT NULL,
  attributes JSON NULL,
  discontinued BIT(1) NOT NULL DEFAULT b'0'
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS {db}.orders (
  id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY,
  customer_id INT UNSIGNED NOT NULL,
  sku VARCHAR(16) NOT NULL,
  quantity SMALLINT NOT NULL,
  unit_price DECIMAL(10,2) NOT NULL,
  status ENUM('new','paid','shipped','cancelled') NOT NULL DEFAULT 'new',
  ordered_on DATE NOT NULL,
  ordered_at DATETIME(6) NOT NULL,
  delivery_window TIME NULL,
  note TEXT CHARACTER SET utf8mb4 NULL,
  KEY (customer_id)
) ENGINE=InnoDB;
CREATE TABLE IF NOT EXISTS {db}.audit_log (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  message VARCHAR(255) NOT NULL,
  logged_at DATETIME NOT NULL
) ENGINE=InnoDB
"""

_FIRST = ["Ada", "Grace", "Linus", "Margaret", "Ken", "Barbara", "Edsger", "Frances", "Zoë", "Łukasz"]
_LAST = ["Lovelace", "Hopper", "Torvalds", "Hamilton", "Thompson", "Liskov", "Dijkstra", "Allen"]
_NOTES = [None, "leave at door", "gift 🎁", "call first ☎", "fragile", "学生割引", None, None]


def create_database(conn: pymysql.Connection, db: str, schema: str) -> None:
    """Create ``db`` and run ``schema`` (statements separated by ``;``, ``{db}`` for the
    quoted database name) in it: the demo databases' one way of being created."""
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE IF NOT EXISTS `{db}`")
        for statement in schema.format(db=f"`{db}`").split(";"):
            if statement.strip():
                cur.execute(statement)
    conn.commit()


def create_schema(conn: pymysql.Connection, db: str = "inventory") -> None:
    create_database(conn, db, SCHEMA)


def _customer(rng: random.Random, i: int) -> tuple[Any, ...]:
    name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    tags = ",".join(t for t in ("b2b", "newsletter", "vip") if rng.random() < 0.3) or None
    created = f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} 10:{i % 60:02d}:00.{i % 999999:06d}"
    return (f"user{i}@example.com", name, rng.randbytes(32), rng.choice(["free", "silver", "gold"]),
            tags, created)


def _product(rng: random.Random, i: int) -> tuple[Any, ...]:
    attributes = json.dumps({"color": rng.choice(["red", "blue", "green"]),
                             "size": rng.randint(1, 5)})
    return (f"SKU{i:06d}", f"Product {i} ✓", Decimal(rng.randint(100, 99999)) / 100,
            round(rng.uniform(0.1, 30), 3), rng.randint(0, 500), attributes, rng.random() < 0.05)


def _order(rng: random.Random, customers: int, products: int) -> tuple[Any, ...]:
    day = f"2025-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return (rng.randint(1, customers), f"SKU{rng.randint(1, products):06d}", rng.randint(1, 9),
            Decimal(rng.randint(100, 99999)) / 100, rng.choice(["new", "paid", "shipped"]), day,
            f"{day} {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}."
            f"{rng.randint(0, 999999):06d}",
            rng.choice([None, "09:00:00", "13:30:00", "18:00:00"]), rng.choice(_NOTES))


ORDER_INSERT = (
    "INSERT INTO {db}.orders (customer_id, sku, quantity, unit_price, status, ordered_on, "
    "ordered_at, delivery_window, note) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s)"
)


def load_initial_data(conn: pymysql.Connection, db: str = "inventory", customers: int = 2_000,
                      products: int = 500, orders: int = 100_000, seed: int = 7,
                      batch: int = 5_000) -> None:
    """Bulk-load the demo data in multi-row transactions."""
    rng = random.Random(seed)
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO `{db}`.customers (email, full_name, password_hash, tier, tags, created_at)"
            " VALUES (%s,%s,%s,%s,%s,%s)", [_customer(rng, i) for i in range(1, customers + 1)])
        cur.executemany(
            f"INSERT INTO `{db}`.products (sku, name, price, weight_kg, stock, attributes, "
            "discontinued) VALUES (%s,%s,%s,%s,%s,%s,%s)",
            [_product(rng, i) for i in range(1, products + 1)])
        conn.commit()
        for start in range(0, orders, batch):
            rows = [_order(rng, customers, products) for _ in range(min(batch, orders - start))]
            cur.executemany(ORDER_INSERT.format(db=f"`{db}`"), rows)
            conn.commit()


@dataclass
class WorkloadStats:
    transactions: int = 0
    rolled_back: int = 0
    statements: int = 0
    errors: list[str] = field(default_factory=list)


class Workload:
    """A background writer: a realistic mix of transactions at roughly ``rate`` per second."""

    def __init__(self, connection_settings: dict[str, Any], db: str = "inventory",
                 rate: float = 200.0, seed: int = 11, customers: int = 2_000,
                 products: int = 500, orders: int = 100_000) -> None:
        self.settings = connection_settings
        self.db = f"`{db}`"
        self.rate = rate
        self.rng = random.Random(seed)
        self.customers = customers
        self.products = products
        self.orders = orders
        self.stats = WorkloadStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run_for(self, seconds: float) -> WorkloadStats:
        deadline = time.monotonic() + seconds
        conn = pymysql.connect(**self.settings, autocommit=False)
        try:
            interval = 1.0 / self.rate if self.rate > 0 else 0.0
            next_at = time.monotonic()
            while time.monotonic() < deadline and not self._stop.is_set():
                self._one_transaction(conn)
                if interval:
                    next_at += interval
                    delay = next_at - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
        finally:
            conn.close()
        return self.stats

    def start(self, seconds: float) -> None:
        self._thread = threading.Thread(target=self.run_for, args=(seconds,), daemon=True)
        self._thread.start()

    def stop(self) -> WorkloadStats:
        self._stop.set()
        return self.join()

    def join(self) -> WorkloadStats:
        if self._thread is not None:
            self._thread.join()
        return self.stats

    def _one_transaction(self, conn: pymysql.Connection) -> None:
        rng, db = self.rng, self.db
        kind = rng.random()
        try:
            with conn.cursor() as cur:
                if kind < 0.45:
                    cur.execute(ORDER_INSERT.format(db=db), _order(rng, self.customers, self.products))
                    statements = 1
                elif kind < 0.65:
                    cur.execute(f"UPDATE {db}.orders SET status = %s, quantity = quantity + 1 "
                                "WHERE id = %s", (rng.choice(["paid", "shipped", "cancelled"]),
                                                  rng.randint(1, self.orders)))
                    statements = 1
                elif kind < 0.72:
                    cur.execute(f"DELETE FROM {db}.orders WHERE id = %s", (rng.randint(1, self.orders),))
                    statements = 1
                elif kind < 0.92:
                    # A multi-statement order: new order, stock decrement, customer touch.
                    order = _order(rng, self.customers, self.products)
                    cur.execute(ORDER_INSERT.format(db=db), order)
                    cur.execute(f"UPDATE {db}.products SET stock = stock - %s WHERE sku = %s",
                                (order[2], order[1]))
                    cur.execute(f"UPDATE {db}.customers SET tier = %s WHERE id = %s",
                                (rng.choice(["free", "silver", "gold"]), order[0]))
                    cur.execute(f"INSERT INTO {db}.audit_log (message, logged_at) VALUES (%s, NOW())",
                                (f"order for customer {order[0]}",))
                    statements = 4
                elif kind < 0.97:
                    # A price change touching many rows in one statement.
                    cur.execute(f"UPDATE {db}.products SET price = price * 1.01 WHERE sku LIKE %s",
                                (f"SKU0000{rng.randint(0, 9)}%",))
                    statements = 1
                else:
                    cur.execute(ORDER_INSERT.format(db=db), _order(rng, self.customers, self.products))
                    cur.execute(f"DELETE FROM {db}.orders WHERE id = %s", (rng.randint(1, self.orders),))
                    conn.rollback()
                    self.stats.rolled_back += 1
                    return
            conn.commit()
            self.stats.transactions += 1
            self.stats.statements += statements
        except pymysql.MySQLError as error:
            conn.rollback()
            self.stats.errors.append(str(error))
