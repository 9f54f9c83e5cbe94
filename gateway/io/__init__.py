"""The socket edge the listeners and clients share: frame writer, exception map, backoff, sizes;
and small structures below the store: the newest bundles of a partition (newest.py)."""
