"""figtank: Figg and Tank listeners over one log, its backends, clients, command and tools."""
