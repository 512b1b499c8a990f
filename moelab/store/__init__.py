"""The DuckDB store. Only the launching process opens it; ranks write the run directory."""
