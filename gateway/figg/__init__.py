"""The Figg side of the gateway, split by job.

- :mod:`.outbox`: the send side of one connection, an ordered frame queue with a byte budget;
- :mod:`.publisher`: PUBLISHes from every connection become one bundle per partition per
  flush (group commit), and each connection's ACKs go out in publish order;
- :mod:`.subscription`: one task per ATTACH, reading the log from its own position;
- :mod:`.session`: one connection: read, parse, dispatch.

:mod:`gateway.figg_listener` puts them together behind :func:`~gateway.figg_listener.serve_figg`.
"""
