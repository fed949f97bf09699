"""Private MariaDB and Kafka-compatible broker for the demo and the tests.

Both run as child processes with their own directories and free ports, never touching the
machine's services; see :mod:`cdc_platform.devservices.mariadb` and
:mod:`cdc_platform.devservices.kafka`. ``python -m cdc_platform.devservices up|down|status``
manages a detached pair for interactive use.
"""

from cdc_platform.devservices._process import DevServiceError, find_processes
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import REPLICATION_GRANTS, MariaDBServer
from cdc_platform.devservices.ports import free_port

__all__ = [
    "REPLICATION_GRANTS",
    "DevServiceError",
    "MariaDBServer",
    "TansuBroker",
    "find_processes",
    "free_port",
]
