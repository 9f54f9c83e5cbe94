"""The tail of a partition and the subscribers that follow it, whatever their protocol.

:mod:`gateway.tail.reader` reads a partition's tail once for every listener's
subscribers (one :class:`~gateway.tail.reader.TailReader` per partition followed), and
:mod:`gateway.tail.followers` is the fan-out engine every listener's view of a tail
uses: the followers a tail's reader feeds itself, each piece encoded once per form and
written to the free sockets in one compiled pass.
"""
