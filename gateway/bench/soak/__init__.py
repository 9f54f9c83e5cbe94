"""The abuse soak: ``python -m gateway.bench.soak`` (not part of ``make test``).

For a fixed time it runs the abuse mix of issue 15 against a figtank it starts (or one
already running on loopback) while a well-behaved client, in a process of its own,
publishes, produces, pings and follows, measuring its latency and which of its messages
were acknowledged. The server's resident memory and descriptors are sampled every 100 ms.
At the end it reads the well-behaved topics back and prints peak and final RSS and
descriptors, the well-behaved client's latency percentiles, the acknowledged messages
lost (must be 0), what each abuser did and whether the server survived. Exit status 1
when an acknowledged message was lost or the server died.

Modules: :mod:`.cli` (options, the run), :mod:`.target` (the server: started or attached,
sampled), :mod:`.good` (the well-behaved client, a child process), :mod:`.abusers` (one
function per abuse), :mod:`.wire` (raw sockets and HTTP), :mod:`.report` (the report).
"""
