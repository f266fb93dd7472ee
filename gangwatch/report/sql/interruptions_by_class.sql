-- Interruptions by class: how many were the platform's (unplanned) and how many planned stops (maintenance,
-- preemption: never counted as the platform's), each class's share of all unplanned ones, and how many of its
-- unplanned ones recovered.
-- param job String '': one job only ('': every job)
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, epoch s (0: no end)
SELECT class, countIf(planned = 0) AS platform, countIf(planned = 1) AS planned_stops,
       round(platform / (SELECT greatest(count(), 1) FROM gw_incidents FINAL
                         WHERE planned = 0 AND ({job} = '' OR job = {job}) AND ifNull(onset_ts, ts) >= {since}
                           AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})), 3) AS platform_share,
       countIf(planned = 0 AND recovered_ts IS NOT NULL) AS recovered
FROM gw_incidents FINAL
WHERE ({job} = '' OR job = {job}) AND ifNull(onset_ts, ts) >= {since} AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
GROUP BY class
ORDER BY platform DESC, class
