"""The backends (the embedded store, the bridge to Tank, the upstream Kafka cluster) and
what listeners build on a backend: placed appends, shared reads, offsets by time."""
