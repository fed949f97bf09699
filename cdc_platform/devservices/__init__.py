"""Private MariaDB, Kafka-compatible broker and S3 server for the demo and the tests.

They run as child processes with their own directories and free ports, never touching the
machine's services; see :mod:`cdc_platform.devservices.mariadb`,
:mod:`cdc_platform.devservices.kafka` and :mod:`cdc_platform.devservices.seaweedfs`.
``python -m cdc_platform.devservices up|down|status`` manages a detached pair (``up --s3``: and
the S3 server) for interactive use.
"""

from cdc_platform.devservices._process import DevServiceError, find_processes
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import REPLICATION_GRANTS, MariaDBServer
from cdc_platform.devservices.ports import free_port
from cdc_platform.devservices.seaweedfs import SeaweedFS

__all__ = [
    "REPLICATION_GRANTS",
    "DevServiceError",
    "MariaDBServer",
    "SeaweedFS",
    "TansuBroker",
    "find_processes",
    "free_port",
]
