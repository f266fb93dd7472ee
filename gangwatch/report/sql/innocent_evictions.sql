-- Innocent evictions: nodes taken out of a job that later ran clean. An eviction is a node in the evicted_nodes of an
-- unplanned incident, at the incident's decision (else its detection, else its onset), in [since, until). Its node
-- ran clean on a day (UTC) after the eviction's day when the rollup gw_node_days holds records of it of a kind in
-- `kinds` (default: NVML samples, `gpu`: the node was up with its GPUs in use; step and heartbeat records name a
-- rank, not a node) and no unplanned incident with onset after the eviction blamed it (culprit_nodes) on or before
-- that day: the days are counted up to the first such blame. The eviction was innocent when the node ran clean on
-- at least `clean_days` days. One row per eviction (innocent ones only unless `all` = 1), in eviction order: its
-- job, incident, class, node, evicted_ts, returned (the first clean day, YYYY-MM-DD), clean_days, blamed_again_ts
-- (the onset of the next incident that blamed it) and innocent (1 or 0). Reads the rollup, never gw_telemetry.
-- param clean_days Int64 3: the least number of clean days that makes an eviction innocent
-- param kinds String 'gpu': telemetry kinds that show a node running, comma-separated (e.g. 'gpu,hw')
-- param all Int64 0: 1 lists every eviction, innocent or not
-- param since Float64 0: evictions at or after this, epoch s
-- param until Float64 0: evictions before this, epoch s (0: no end)
SELECT ev.2 AS job, ev.3 AS incident, ev.4 AS class, node, ev.1 AS evicted_ts,
       if(length(clean) > 0, toString(toDate(toUInt16(clean[1]))), NULL) AS returned, length(clean) AS clean_days,
       if(length(later) > 0, arrayReduce('min', later), NULL) AS blamed_again_ts,
       toUInt8(length(clean) >= {clean_days}) AS innocent
FROM (
    -- (ClickHouse 18.16's lambdas cannot read a column: what they compare with comes in via replicate)
    SELECT node, ev, toUInt32(floor(ev.1 / 86400)) AS evicted_day,
           arrayFilter((b, t) -> b > t, blames, replicate(ev.1, blames)) AS later,
           if(length(later) > 0, toUInt32(floor(arrayReduce('min', later) / 86400)), 4294967295) AS blamed_day,
           arraySort(arrayFilter((d, e, b) -> d > e AND d < b, days, replicate(evicted_day, days),
                                 replicate(blamed_day, days))) AS clean
    FROM (
        SELECT node, groupArrayIf((t, job, id, class), src = 'eviction') AS evictions,
               groupArrayIf(t, src = 'blame') AS blames, groupArrayIf(day, src = 'seen') AS days
        FROM (
            SELECT node, 'eviction' AS src, ifNull(decided_ts, ifNull(detected_ts, ifNull(onset_ts, ts))) AS t, job, id,
                   class, toUInt32(0) AS day
            FROM gw_incidents FINAL
            ARRAY JOIN evicted_nodes AS node
            WHERE planned = 0 AND ifNull(decided_ts, ifNull(detected_ts, ifNull(onset_ts, ts))) >= {since}
              AND ({until} = 0 OR ifNull(decided_ts, ifNull(detected_ts, ifNull(onset_ts, ts))) < {until})
            UNION ALL
            SELECT node, 'blame' AS src, ifNull(onset_ts, ts) AS t, '' AS job, '' AS id, '' AS class, toUInt32(0) AS day
            FROM gw_incidents FINAL
            ARRAY JOIN culprit_nodes AS node
            WHERE planned = 0
            UNION ALL
            SELECT node, 'seen' AS src, 0. AS t, '' AS job, '' AS id, '' AS class, toUInt32(day) AS day
            FROM gw_node_days
            WHERE has(splitByChar(',', {kinds}), kind)
            GROUP BY node, day
            HAVING sum(records) > 0
        )
        GROUP BY node
        HAVING length(evictions) > 0
    )
    ARRAY JOIN evictions AS ev
)
WHERE {all} = 1 OR length(clean) >= {clean_days}
ORDER BY evicted_ts, incident, node
