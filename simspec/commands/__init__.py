"""One module per `simspec` sub-command beyond predict/presets; simspec.cli registers them by name."""
