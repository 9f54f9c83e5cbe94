"""The socket edge the listeners and clients share: frame writer, exception map, backoff, sizes."""
