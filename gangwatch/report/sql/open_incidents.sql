-- Open incidents: unplanned ones not recovered yet, oldest first, with how long each has been open.
-- One row per incident: its job, id, class, culprit nodes, recovery path, onset (epoch s) and open_s.
-- param job String '': one job only ('': every job)
-- param now Float64 0: the moment open_s is measured at, epoch s (0: the data's last event time)
SELECT job, id, class, culprit_nodes, path, onset_ts,
       round(if({now} > 0, {now}, {data_end}) - onset_ts, 1) AS open_s
FROM gw_incidents FINAL
WHERE recovered_ts IS NULL AND planned = 0 AND ({job} = '' OR job = {job})
ORDER BY onset_ts, id
