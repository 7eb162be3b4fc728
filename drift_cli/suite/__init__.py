"""Suites: declared grids of bench runs (`suites/*.toml`), run locally or on Ray, resumed, reported.

`spec` parses a suite file into cells, `store` keeps their results on disk, `executors` runs
them, `report` aggregates them. The command line is `drift_cli.commands.suite`.
"""
