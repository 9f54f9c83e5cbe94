"""Types of the compiled fan-out loop (``gateway/io/_fanout.pyx``); the reference is
:func:`gateway.io.fanout.send_each_python`."""

from array import array

# fds: any buffer of C ints (an array("i")); data: any bytes-like buffer.
def send_each(fds: array[int] | memoryview, data: bytes | bytearray | memoryview,
              ) -> list[tuple[int, int]]: ...
