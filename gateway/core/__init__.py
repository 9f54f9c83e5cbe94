"""What every part above the store builds on: the settings (config, config_values), metrics,
logs, and the Backend contract (what a listener may ask of the log)."""
