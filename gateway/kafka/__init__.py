"""The Kafka listener: serves Kafka's protocol (protocols.kafka) over a Backend.

Kafka offset = Tank sequence - 1; one record batch is one Tank bundle.
"""
