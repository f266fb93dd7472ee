-- Time to recover (MTTR), per job and week of onset: unplanned incidents, how many recovered, and the mean and
-- longest seconds from onset to recovery of those that did. Weeks start on Monday (UTC), written YYYY-MM-DD.
-- param job String '': one job only ('': every job)
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, epoch s (0: no end)
SELECT job, toString(toMonday(toDateTime(toUInt32(assumeNotNull(onset_ts))))) AS week, count() AS incidents,
       countIf(recovered_ts IS NOT NULL) AS recovered,
       if(recovered > 0, round(sumIf(assumeNotNull(recovered_ts) - assumeNotNull(onset_ts),
                                     recovered_ts IS NOT NULL) / recovered, 1), NULL) AS mttr_s,
       if(recovered > 0, round(maxIf(assumeNotNull(recovered_ts) - assumeNotNull(onset_ts),
                                     recovered_ts IS NOT NULL), 1), NULL) AS max_ttr_s
FROM gw_incidents FINAL
WHERE planned = 0 AND onset_ts IS NOT NULL AND ({job} = '' OR job = {job})
  AND onset_ts >= {since} AND ({until} = 0 OR onset_ts < {until})
GROUP BY job, week
ORDER BY job, week
