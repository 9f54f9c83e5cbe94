"""The process: the wiring of listeners and backend (run), the workers of serve --workers N,
the metrics and health endpoint, a serving process's exit status."""
