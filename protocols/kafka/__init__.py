"""Kafka: record batches (magic v2) and their mapping to Tank bundles."""
