"""Private MariaDB, Kafka-compatible broker, S3 server and Spark cluster for demo and tests.

They run as child processes with their own directories and free ports, never touching the
machine's services; see :mod:`cdc_platform.devservices.mariadb`,
:mod:`cdc_platform.devservices.kafka`, :mod:`cdc_platform.devservices.seaweedfs` and
:mod:`cdc_platform.devservices.spark_cluster`.
``python -m cdc_platform.devservices up|down|status`` manages a detached pair (``up --s3``: and
the S3 server) for interactive use.
"""

from cdc_platform.devservices._process import DevServiceError, find_processes
from cdc_platform.devservices.kafka import TansuBroker
from cdc_platform.devservices.mariadb import REPLICATION_GRANTS, MariaDBServer
from cdc_platform.devservices.ports import free_port
from cdc_platform.devservices.seaweedfs import SeaweedFS
from cdc_platform.devservices.spark_cluster import SparkCluster

__all__ = [
    "REPLICATION_GRANTS",
    "DevServiceError",
    "MariaDBServer",
    "SeaweedFS",
    "SparkCluster",
    "TansuBroker",
    "find_processes",
    "free_port",
]
