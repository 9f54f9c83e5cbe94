"""The Figg side of the gateway, split by job.

- :mod:`.outbox`: the send side of one connection, an ordered frame queue with a byte budget;
- :mod:`.publisher`: the PUBLISHes of one read become one bundle per partition, appended at
  once (fsync rounds are shared by every connection), and ACKs go out in publish order;
- :mod:`.subscription`: one task per ATTACH, reading the log from its own position;
- :mod:`.feed`: the subscribers of a topic at the tail, fed by one reader of the log;
- :mod:`.frames`: DATA frames shared by subscribers at the same position;
- :mod:`.session`: one connection: read, parse, dispatch.

:mod:`gateway.figg.listener` puts them together in :class:`~gateway.figg.listener.FiggListener`.
"""
