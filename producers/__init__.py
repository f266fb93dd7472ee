"""Node sidecars that turn a node's raw signals into contract-v1 records."""
