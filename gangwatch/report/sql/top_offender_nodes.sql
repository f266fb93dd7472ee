-- Top offender nodes: the nodes unplanned incidents blamed (culprit) or took out of the job (evicted) most often.
-- A node blamed again and again is one to take out of the fleet for a deeper test.
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, epoch s (0: no end)
-- param limit Int64 20: at most this many nodes
SELECT node, sum(blamed) AS blamed, sum(evicted) AS evicted
FROM (
    SELECT arrayJoin(culprit_nodes) AS node, toUInt64(1) AS blamed, toUInt64(0) AS evicted
    FROM gw_incidents FINAL
    WHERE planned = 0 AND ifNull(onset_ts, ts) >= {since} AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
    UNION ALL
    SELECT arrayJoin(evicted_nodes) AS node, toUInt64(0) AS blamed, toUInt64(1) AS evicted
    FROM gw_incidents FINAL
    WHERE planned = 0 AND ifNull(onset_ts, ts) >= {since} AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
)
GROUP BY node
ORDER BY blamed DESC, evicted DESC, node
LIMIT {limit}
