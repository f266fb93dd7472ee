"""Triage: fuse findings per node, localize the culprit, decide, and keep the incident record. Pure."""
