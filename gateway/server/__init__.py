"""The server shell: settings, logs, metrics and health, sockets, one process's run."""
