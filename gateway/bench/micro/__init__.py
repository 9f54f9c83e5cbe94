"""Micro-benchmarks of single parts (codecs, store, bridge, Spark), run as scripts."""
