"""Upstream-Kafka mode: figtank in front of a Kafka-protocol cluster."""
