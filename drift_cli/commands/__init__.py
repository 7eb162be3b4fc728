"""Click command groups, one module per top-level command (registered in `drift_cli.cli`)."""
