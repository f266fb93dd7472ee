-- Machines down per day (UTC) of onset: the failures the warm-standby pool is sized from (`gangwatch spares`).
-- The culprit machines of an unplanned incident are its failures: per day, how many incidents took machines,
-- how many machines failed (one blamed twice counts twice), how many distinct machines, the most one incident
-- took at once (a burst: a switch, a rack, a driver rollout), how many of the failures recovered and how many
-- are still open, and the mean seconds from onset to the job's recovery over the incidents that recovered: the
-- job's time back on a spare, not the machine's repair, which the store does not know.
-- param job String '': one job only ('': the whole fleet)
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, epoch s (0: no end)
SELECT toString(toDate(toDateTime(day_ts, 'UTC'))) AS day, day_ts, count() AS incidents, sum(n) AS failures,
       uniqExactArray(culprit_nodes) AS machines, max(n) AS largest,
       sumIf(n, recovered_ts IS NOT NULL) AS recovered, sumIf(n, recovered_ts IS NULL) AS open,
       if(countIf(recovered_ts IS NOT NULL) > 0,
          round(avgIf(assumeNotNull(recovered_ts) - t, recovered_ts IS NOT NULL), 1), NULL) AS mean_recover_s
FROM (
    SELECT ifNull(onset_ts, ifNull(detected_ts, ts)) AS t, intDiv(toUInt32(t), 86400) * 86400 AS day_ts,
           culprit_nodes, length(culprit_nodes) AS n, recovered_ts
    FROM gw_incidents FINAL
    WHERE planned = 0 AND length(culprit_nodes) > 0 AND ({job} = '' OR job = {job})
      AND t >= {since} AND ({until} = 0 OR t < {until})
)
GROUP BY day_ts
ORDER BY day_ts
