"""Tank: message declarations (``specs/``), records and codecs, bundles, the connection."""
