-- Effective training time ratio (ETTR) per job: productive training time over wall time. Wall time runs from the
-- job's first move (gw_jobs: its life) to the end of the window: `until`, else its last move (its end, for a job
-- that finished or was stopped). Productive is the time its life spent `running`, less the part of that time
-- inside unplanned incidents of a class that stops the job (fail_stop, hang, stall, unknown: schemas/classes.py),
-- from onset to recovery (an open one: to the window's end), overlapping ones counted once. Starting, paused,
-- stopping, failed and restarting time is not productive; planned stops are never the platform's but are not
-- training either. A job without moves in gw_jobs has no row.
-- param job String '': one job only ('': every job)
-- param until Float64 0: the end of the window, epoch s (0: each job's last move)
SELECT job, round(wall_s, 1) AS wall_s, round(running_s, 1) AS running_s, round(lost_s, 1) AS lost_s,
       if(wall_s > 0, round((running_s - lost_s) / wall_s, 4), NULL) AS ettr
FROM (
    -- (ClickHouse 18.16's lambdas cannot read a column: what they need comes in as arguments, via replicate)
    SELECT job, end_ts - t[1] AS wall_s,
           arrayMap((a, E) -> least(a, E), arrayFilter((x, st) -> st = 'running', t, s),
                    replicate(end_ts, arrayFilter((x, st) -> st = 'running', t, s))) AS ra,
           arrayMap((b, E) -> least(b, E), arrayFilter((x, st) -> st = 'running', arrayPushBack(arraySlice(t, 2), end_ts), s),
                    replicate(end_ts, ra)) AS rb,
           arraySum(arrayMap((a, b) -> greatest(0., b - a), ra, rb)) AS running_s,
           -- per running interval, the length of the union of the incidents in it (sorted by onset: each adds
           -- what it covers past the latest end before it)
           arraySum(arrayMap((a, b, O, F) -> arraySum(arrayMap(i -> greatest(0., least(b, F[i])
                   - greatest(greatest(a, O[i]), if(i = 1, a, arrayReduce('max', arrayMap(x -> least(b, x),
                                                                                     arraySlice(F, 1, i - 1)))))),
                   arrayEnumerate(O))), ra, rb, replicate(io, ra), replicate(ie, ra))) AS lost_s
    FROM (
        SELECT job, arrayMap(x -> x.1, moves) AS t, arrayMap(x -> x.2, moves) AS s,
               if({until} > 0, {until}, t[length(t)]) AS end_ts,
               arrayMap(x -> x.1, incidents) AS io, arrayMap(x -> x.2, incidents) AS ie
        FROM (
            SELECT job, arraySort(x -> x.1, groupArrayIf((ts, state), src = 'life')) AS moves,
                   arraySort(x -> x.1, groupArrayIf((o, e), src = 'incident')) AS incidents
            FROM (
                SELECT job, 'life' AS src, ts, state, 0. AS o, 0. AS e
                FROM gw_jobs FINAL
                WHERE ({job} = '' OR job = {job}) AND ({until} = 0 OR ts < {until})
                UNION ALL
                SELECT job, 'incident' AS src, 0. AS ts, '' AS state, assumeNotNull(onset_ts) AS o,
                       ifNull(recovered_ts, 1e18) AS e
                FROM gw_incidents FINAL
                WHERE planned = 0 AND onset_ts IS NOT NULL AND class IN ('fail_stop', 'hang', 'stall', 'unknown')
                  AND ({job} = '' OR job = {job})
            )
            GROUP BY job
            HAVING length(moves) > 0
        )
    )
)
ORDER BY job
