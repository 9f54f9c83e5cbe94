"""Kafka consumer groups: the group coordinator and the groups' committed offsets."""
