"""CDC from MySQL/MariaDB read replicas into reconciled lake tables, orchestrated by Dagster."""
