"""Change topics: the landing zone's change records as Kafka messages in the JSON envelope of
Debezium's MySQL connector (docs/change-topics.md). The modules here are pure encoding: topic
names (``naming``), one column's Connect schema and values (``encoding``), and the key/value
messages of a batch of records (``envelope``); the publisher that reads segments and produces
the messages lives above them."""
