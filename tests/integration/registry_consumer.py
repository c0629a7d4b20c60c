"""Reads topics with Confluent's own deserializer, as a registry-aware
consumer would: confluent-kafka's AvroDeserializer and SchemaRegistryClient
(from PyPI), nothing of readfold's. Prints one JSON line per record:
{"topic", "partition", "key", "value"}, bytes as {"bytes": <latin-1 text>},
timestamps as milliseconds since the epoch.

usage: registry_consumer.py BOOTSTRAP REGISTRY_URL TOPIC...
"""

import datetime
import json
import sys
import uuid

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def plain(value):
    if isinstance(value, datetime.datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, bytes):
        return {"bytes": value.decode("latin-1")}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def main():
    bootstrap, registry_url, topics = sys.argv[1], sys.argv[2], sys.argv[3:]
    registry = SchemaRegistryClient({"url": registry_url})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"registry-check-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    assignment = []
    for topic in topics:
        metadata = consumer.list_topics(topic, timeout=10).topics[topic]
        for partition in metadata.partitions:
            assignment.append(TopicPartition(topic, partition, 0))
    consumer.assign(assignment)
    remaining = {(tp.topic, tp.partition) for tp in assignment}
    while remaining:
        message = consumer.poll(10)
        if message is None:
            sys.exit(f"no record within 10 s; still waiting for {sorted(remaining)}")
        if message.error():
            if message.error().code() == KafkaError._PARTITION_EOF:
                remaining.discard((message.topic(), message.partition()))
                continue
            sys.exit(f"consumer error: {message.error()}")
        topic = message.topic()
        key = deserialize(message.key(), SerializationContext(topic, MessageField.KEY))
        value = deserialize(message.value(), SerializationContext(topic, MessageField.VALUE))
        print(json.dumps({"topic": topic, "partition": message.partition(), "key": plain(key), "value": plain(value)}))
    consumer.close()


if __name__ == "__main__":
    main()
