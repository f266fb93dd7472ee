"""The fault kinds the simulator injects, and what each does: one table for the simulator
(`simulate.scenario.FAULT_KINDS`), `gangwatch simulate --help` and its errors. A module of its own, importing
nothing: the CLI's `--help` reads it without loading the simulator (and numpy)."""

FAULT_HELP: dict[str, str] = {
    "xid79": "a GPU falls off the bus (Xid 79): its rank dies with it",
    "node_loss": "a whole node vanishes (power, kernel panic)",
    "thermal_straggler": "a GPU throttles: its rank computes MAGNITUDE slower (default 0.10)",
    "nic_degradation": "a node's NIC degrades: collectives through it MAGNITUDE slower (default 0.30)",
    "intermittent_straggler": "a rank MAGNITUDE slower in some steps (default 0.15)",
    "dataloader_hang": "a rank's data loader stalls: steps stop, heartbeats go on",
    "pp_deadlock": "a pipeline stage deadlocks: steps stop",
    "sdc": "a rank's numbers go silently wrong: its replica digest disagrees, then the loss blows up",
    "planned_maintenance": "the node is drained on purpose: the job stops, then restarts on a spare",
    "link_errors": "a GPU's PCIe/NVLink error counters climb (a precursor: no incident)",
    "heterogeneous": "a rank steadily MAGNITUDE slower from the start (default 0.05): a difference, no fault",
    "clock_skew": "a node's clock 30 s ahead from AT_S: its records' times are wrong, not the node",
    "late_delivery": "a node's records from AT_S arrive 20 s late: its monitoring path, not the node",
}
