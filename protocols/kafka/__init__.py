"""Kafka's wire protocol, sans-IO: message declarations in Kafka's own JSON format
(``specs/``), the records and codecs generated from them (``records``), framing
(``connection``), API keys and error codes (``types``), record batches (``batch``,
``codecs``) and their mapping to Tank bundles (``bundles``)."""
