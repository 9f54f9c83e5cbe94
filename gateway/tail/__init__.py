"""The tail of a partition and the subscribers that follow it, whatever their protocol.

:mod:`gateway.tail.followers` is the fan-out engine every listener's tail uses: the
followers a tail's reader feeds itself, each piece encoded once per form and written to
the free sockets in one compiled pass.
"""
