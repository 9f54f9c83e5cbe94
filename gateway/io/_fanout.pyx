# cython: language_level=3, boundscheck=False, wraparound=False
"""The fan-out loop in C: the same bytes to many sockets in one call.

:func:`send_each` sends ``data`` on every descriptor with one non-blocking ``send()``
each (``MSG_NOSIGNAL | MSG_DONTWAIT``: a closed peer is an error, never a signal; a full
socket buffer is ``EAGAIN``, never a wait), without the GIL, and returns the descriptors
it could not finish. :func:`gateway.io.fanout.send_each_python` is its reference.
"""

from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdlib cimport free, malloc

cdef extern from "<errno.h>" nogil:
    int EWOULDBLOCK

cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void* buf, size_t n, int flags)
    int MSG_NOSIGNAL
    int MSG_DONTWAIT


def send_each(const int[:] fds, const unsigned char[:] data):
    """Send ``data`` on each of ``fds``; returns ``(index, result)`` for each descriptor
    not sent all of it, in order: ``result`` is the bytes it took (0 when its buffer was
    full, less than ``len(data)`` for a partial write) or ``-errno`` on an error."""
    cdef Py_ssize_t count = fds.shape[0]
    cdef size_t size = data.shape[0]
    cdef Py_ssize_t i, unfinished = 0
    cdef ssize_t sent
    cdef const unsigned char* buf
    cdef Py_ssize_t* where
    cdef ssize_t* results
    if count == 0 or size == 0:
        return []
    buf = &data[0]
    where = <Py_ssize_t*>malloc(count * sizeof(Py_ssize_t))
    results = <ssize_t*>malloc(count * sizeof(ssize_t))
    if where == NULL or results == NULL:
        free(where)
        free(results)
        raise MemoryError()
    try:
        with nogil:
            for i in range(count):
                while True:
                    sent = send(fds[i], buf, size, MSG_NOSIGNAL | MSG_DONTWAIT)
                    if sent >= 0 or errno != EINTR:
                        break
                if sent == <ssize_t>size:
                    continue
                if sent < 0:
                    sent = 0 if (errno == EAGAIN or errno == EWOULDBLOCK) else -errno
                where[unfinished] = i
                results[unfinished] = sent
                unfinished += 1
        return [(where[i], results[i]) for i in range(unfinished)]
    finally:
        free(where)
        free(results)
