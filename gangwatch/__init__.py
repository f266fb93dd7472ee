"""gangwatch: fault detection for large GPU training jobs. The CLI lives in `gangwatch.cli`."""

__version__ = "0.1.0"
