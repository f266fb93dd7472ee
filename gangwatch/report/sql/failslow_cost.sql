-- Fail-slow cost per job: the training time stragglers took, in seconds and in GPU-hours. Each unplanned fail_slow
-- incident whose onset is in [since, until) counts from its onset to its recovery (an open one, or one recovered
-- after the window: to `until`, else the data's last event time): open_s. What the straggler cost each step is the largest `cost_frac` of
-- the job's `fail_slow` findings reported in that span (detectors/failslow.py StragglerEvidence: the seconds it adds
-- to the job's step, as a fraction of the typical step; where a finding has none, its `slowdown_frac`, as triage
-- reads it); an incident with no such finding costs 0. A step slowed by c lasts (1 + c) typical steps, so the share
-- c / (1 + c) of the open time was waiting: lost_s = open_s x c / (1 + c). GPU-hours: lost_s x the job's ranks (one
-- GPU each: `job_ranks` of its latest move in gw_jobs at or before the onset, else its first one) / 3600; NULL for a
-- job with no ranks in gw_jobs. One row per job with such an incident: incidents, still_open (open at the window's
-- end), open_s, lost_s, gpu_hours and peak_cost_frac (the largest c of any of its incidents).
-- param job String '': one job only ('': every job)
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, and the end of every span, epoch s (0: the data's last event time)
SELECT job, count() AS incidents, sum(open_at_end) AS still_open, round(sum(span_s), 1) AS open_s,
       round(sum(waited_s), 1) AS lost_s, round(sum(waited_s * ranks) / 3600, 3) AS gpu_hours,
       round(max(cost), 4) AS peak_cost_frac
FROM (
    -- (ClickHouse 18.16's lambdas cannot read a column: what they compare with comes in via replicate)
    SELECT job, inc.1 AS onset, inc.2 AS end_ts, inc.3 AS open_at_end, greatest(0., end_ts - onset) AS span_s,
           arrayReduce('max', arrayMap(f -> f.2, arrayFilter((f, a, b) -> f.1 >= a AND f.1 <= b, costs,
                                                             replicate(onset, costs), replicate(end_ts, costs)))) AS cost,
           span_s * cost / (1 + cost) AS waited_s,
           arrayFilter((m, a) -> m.1 <= onset, moves, replicate(onset, moves)) AS before,
           if(length(moves) = 0, NULL, if(length(before) > 0, before[length(before)].2, moves[1].2)) AS ranks
    FROM (
        SELECT job, groupArrayIf((t1, t2, n), src = 'incident') AS incidents,
               groupArrayIf((t1, v), src = 'finding') AS costs,
               arraySort(x -> x.1, groupArrayIf((t1, v), src = 'move')) AS moves
        FROM (
            SELECT job, 'incident' AS src, ifNull(onset_ts, ts) AS t1,
                   if({until} > 0, {until}, {data_end}) AS window_end,
                   least(ifNull(recovered_ts, 1e18), window_end) AS t2, toUInt8(ifNull(recovered_ts, 1e18) > window_end) AS n,
                   0. AS v
            FROM gw_incidents FINAL
            WHERE planned = 0 AND class = 'fail_slow' AND ({job} = '' OR job = {job})
              AND ifNull(onset_ts, ts) >= {since} AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
            UNION ALL
            SELECT job, 'finding' AS src, ts AS t1, 0. AS window_end, 0. AS t2, toUInt8(0) AS n,
                   if(visitParamExtractRaw(evidence, 'cost_frac') IN ('', 'null'),
                      visitParamExtractFloat(evidence, 'slowdown_frac'),
                      visitParamExtractFloat(evidence, 'cost_frac')) AS v
            FROM gw_findings FINAL
            WHERE type = 'fail_slow' AND ({job} = '' OR job = {job})
            UNION ALL
            SELECT job, 'move' AS src, ts AS t1, 0. AS window_end, 0. AS t2, toUInt8(0) AS n, toFloat64(job_ranks) AS v
            FROM gw_jobs FINAL
            WHERE job_ranks > 0 AND ({job} = '' OR job = {job})
        )
        GROUP BY job
        HAVING length(incidents) > 0
    )
    ARRAY JOIN incidents AS inc
)
GROUP BY job
ORDER BY job
