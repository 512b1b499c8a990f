"""The typed case record every producer writes and ingest reads."""
