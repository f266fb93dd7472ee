"""Outputs: ClickHouse (server or embedded chDB), JSONL files, the alert topic, the job controller."""
