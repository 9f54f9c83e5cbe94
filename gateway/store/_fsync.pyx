# cython: language_level=3, boundscheck=False, wraparound=False
"""The fsync worker loop in C: it never takes the GIL.

A Python fsync thread needs the GIL to pick up a job and again after ``fdatasync``
returns, so each round waits for the event loop's thread to let go of it. This loop runs
in a thread of its own (started by :class:`gateway.store.syncer.NativeSyncer`) without
the GIL: it reads job records from a pipe, syncs their descriptors and writes a result
record to another pipe, which the event loop watches.

Records (native byte order, fixed size, so that a pipe hands each reader whole ones):

- job: ``u64 job_id | i32 count | i32 pad | i32 flags[MAX_FDS] | i32 fds[MAX_FDS]`` where
  flag bit :data:`FSYNC` asks for ``fsync`` (a directory) instead of ``fdatasync`` and bit
  :data:`CLOSE` hands the descriptor to the worker, which closes it once the job is done
  (after a failed sync too, and before the result is written: a reported job holds no
  descriptor), so that the event loop's thread spends no ``close`` on it; job id 0 stops
  the worker;
- result: ``u64 job_id | i32 errno (0: done) | i32 pad | u64 nanoseconds``.
"""

from libc.errno cimport EINTR, errno
from libc.stdint cimport int32_t, uint64_t
from libc.string cimport memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport close, fdatasync, fsync, read, write

DEF _MAX_FDS = 30
DEF _FSYNC = 1
DEF _CLOSE = 2

cdef struct Job:
    uint64_t job_id
    int32_t count
    int32_t pad
    int32_t flags[_MAX_FDS]
    int32_t fds[_MAX_FDS]

cdef struct Result:
    uint64_t job_id
    int32_t error
    int32_t pad
    uint64_t nanoseconds

#: Descriptors one job may carry.
MAX_FDS = _MAX_FDS
#: Bytes of a job record and of a result record.
JOB_SIZE = sizeof(Job)
RESULT_SIZE = sizeof(Result)
#: Job flag bits: ``fsync`` instead of ``fdatasync``; close the descriptor once done.
FSYNC = _FSYNC
CLOSE = _CLOSE


cdef uint64_t _now_ns() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return <uint64_t>ts.tv_sec * 1000000000 + <uint64_t>ts.tv_nsec


cdef int _read_full(int fd, char* buf, size_t size) noexcept nogil:
    """1 on a whole record, 0 at EOF, -1 on an error."""
    cdef size_t got = 0
    cdef ssize_t n
    while got < size:
        n = read(fd, buf + got, size - got)
        if n == 0:
            return 0
        if n < 0:
            if errno == EINTR:
                continue
            return -1
        got += n
    return 1


cdef int _write_full(int fd, const char* buf, size_t size) noexcept nogil:
    cdef size_t done = 0
    cdef ssize_t n
    while done < size:
        n = write(fd, buf + done, size - done)
        if n < 0:
            if errno == EINTR:
                continue
            return -1
        done += n
    return 0


def run_worker(int jobs_fd, int results_fd):
    """Serve jobs from ``jobs_fd`` until a stop record or EOF; report on ``results_fd``.

    Call it from a thread of its own: it returns only when told to stop.
    """
    cdef Job job
    cdef Result result
    cdef int i, status, rc
    cdef uint64_t started
    with nogil:
        while True:
            status = _read_full(jobs_fd, <char*>&job, sizeof(Job))
            if status <= 0 or job.job_id == 0:
                break
            memset(&result, 0, sizeof(Result))
            result.job_id = job.job_id
            started = _now_ns()
            if job.count < 0 or job.count > _MAX_FDS:
                result.error = 22  # EINVAL: a malformed job syncs nothing
            else:
                for i in range(job.count):
                    if job.flags[i] & _FSYNC:
                        rc = fsync(job.fds[i])
                    else:
                        rc = fdatasync(job.fds[i])
                    if rc != 0:
                        result.error = errno
                        break
            result.nanoseconds = _now_ns() - started
            # Before the report: once a job is reported, its descriptors are gone, so the
            # store's descriptor bound holds (a close of a dup costs ~1 us).
            if 0 <= job.count <= _MAX_FDS:
                for i in range(job.count):
                    if job.flags[i] & _CLOSE:
                        close(job.fds[i])
            if _write_full(results_fd, <const char*>&result, sizeof(Result)) != 0:
                break
