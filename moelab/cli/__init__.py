"""The typer command line: a thin layer over the library."""
