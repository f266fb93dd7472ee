"""Pure, incremental detectors: contract records in, findings out. No I/O, no wall clock."""
