"""What a fleet's history teaches, as pure functions over node fault histories.

`history`: the import format of a node fault history (node, start, end, class, description), read from CSV or
JSONL, or made from gangwatch's own closed incidents; `rules`: precursor patterns mined from such histories and
scored out of sample; `spares`: the warm-standby pool a job needs, sized from the observed failure rate; `kb`:
closed incidents as knowledge-base entries (timeline, root cause, evidence signature, path, stages against
budget), searched by node, class, cause or likeness, and the closest one cited by triage's decisions. Nothing
here does I/O beyond parsing the text it is handed, or reads a clock: the command line reads files and stores.
"""
