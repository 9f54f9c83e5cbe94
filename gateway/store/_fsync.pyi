"""Types of the compiled fsync worker (``gateway/store/_fsync.pyx``), used by
:class:`gateway.store.syncer.NativeSyncer`."""

MAX_FDS: int
JOB_SIZE: int
RESULT_SIZE: int
FSYNC: int
CLOSE: int

def run_worker(jobs_fd: int, results_fd: int) -> None: ...
