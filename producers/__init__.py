"""Node sidecars and tools that turn raw signals (kernel log, NVML, dumps, simulation) into contract records."""
