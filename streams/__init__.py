"""Runtimes that drive the pure core: in-process replay (embedded default) and the Faust worker."""
