"""``figtank bench``: a load generator for the Tank and Figg protocols.

The same workloads run against any endpoint that speaks them (figtank, a Tank broker, a
Figg server), so one tool measures figtank and its peers side by side.

Modules: :mod:`.scenario` (what a scenario is), :mod:`.scenarios` (the table of them),
one module per scenario family (:mod:`.tank`, :mod:`.figg`, :mod:`.e2e`, :mod:`.loopback`),
helpers (:mod:`.payload`, :mod:`.stats`, :mod:`.report`,
:mod:`.procs`, :mod:`.endpoints`, :mod:`.serving`) and :mod:`.suite` (``make bench``).
"""
