"""The sources of the embedded demo config (``demo/demo.yaml``) and the variables it reads for each.

One definition for ``make demo`` / ``make ui`` (``demo.run``) and for
``python -m cdc_platform.devservices up``, which both start a private MariaDB server per source
and hand its address to the config through these variables.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdc_platform.devservices.mariadb import MariaDBServer


@dataclass(frozen=True)
class DemoSource:
    """A source of the demo config: its ``server_name``, its server's folder under the
    services' base dir, and the prefix of the variables the config reads its host, port and
    password (``password_env``) from."""

    server_name: str
    folder: str
    env_prefix: str

    def variables(self, server: MariaDBServer) -> dict[str, str]:
        """``<prefix>_HOST``, ``_PORT``, ``_USER`` and ``_PASSWORD`` of ``server``'s CDC
        account."""
        settings = server.connection_settings()
        return {f"{self.env_prefix}_{key.upper()}": str(settings[key])
                for key in ("host", "port", "user", "password")}


DEMO_SOURCES = (DemoSource("demo", "mariadb", "CDC_SOURCE"),  # the inventory database
                DemoSource("billing", "mariadb-billing", "CDC_BILLING"))  # invoices, payments
