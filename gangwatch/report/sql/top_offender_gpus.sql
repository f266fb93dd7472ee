-- Top offender GPUs: the nodes and GPUs most often named by findings that can open an incident (an interruption's
-- evidence against them). One row per (node, GPU) named, gpu NULL for the findings that named the node but no GPU,
-- most findings first: findings, node_findings (all of its node's), the finding types, how many jobs, and the last
-- one's time. `types` lists the finding types counted: by default every type a detector declares as able to open an
-- incident and that is evidence against a node (detectors/registry.py: a policy with an incident class; job-level
-- ones name no node). A type that opens only at times counts every finding of it (hw_fault at every severity,
-- heterogeneous at any cost): each still names its GPU.
-- param types String 'comm_error,fail_slow,fail_stop,hang,heterogeneous,hw_fault,sdc_suspect,stack_outlier': finding types counted, comma-separated
-- param since Float64 0: findings at or after this, epoch s
-- param until Float64 0: findings before this, epoch s (0: no end)
-- param limit Int64 20: at most this many rows
SELECT node, if(g.1 < 0, NULL, g.1) AS gpu, g.2 AS findings, node_findings, g.3 AS types, g.4 AS jobs, g.5 AS last_ts
FROM (
    SELECT node, sum(n) AS node_findings, groupArray((gpu_or_none, n, named_types, n_jobs, last)) AS gpus
    FROM (
        SELECT node, ifNull(gpu, -1) AS gpu_or_none, count() AS n, arraySort(groupUniqArray(type)) AS named_types,
               uniqExact(job) AS n_jobs, max(ts) AS last
        FROM gw_findings FINAL
        WHERE node != '' AND has(splitByChar(',', {types}), type) AND ts >= {since} AND ({until} = 0 OR ts < {until})
        GROUP BY node, gpu_or_none
    )
    GROUP BY node
)
ARRAY JOIN gpus AS g
ORDER BY findings DESC, node_findings DESC, node, g.1
LIMIT {limit}
