"""The backend contract and its implementations: the embedded store, the bridge to Tank."""
