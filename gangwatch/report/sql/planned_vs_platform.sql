-- Planned against the platform's, per job: how many interruptions and how many seconds of downtime were the
-- platform's (unplanned incidents) and how many were planned (maintenance, preemption: `planned` incidents, never
-- counted as the platform's), and the platform's share of each. Interruptions are the incidents whose onset is in
-- [since, until), of every class. Downtime is the time from onset to recovery (an open one, or one recovered after
-- the window: to `until`, else the data's last event time) of planned incidents and of unplanned ones of a class that stops the job
-- (fail_stop, hang, stall, unknown: schemas/classes.py; a straggler or silent corruption leaves the job training,
-- see failslow_cost), overlapping ones counted once: planned_down_s is the union of the planned spans,
-- platform_down_s what the unplanned ones cover outside them (a second both cover is planned). One row per job with
-- an incident in the window, then a row `(all)`: the sums over those jobs (job-seconds) and their shares.
-- param job String '': one job only ('': every job)
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, and the end of every span, epoch s (0: the data's last event time)
SELECT r.1 AS job, r.2 AS platform, r.3 AS planned, round(r.4, 1) AS platform_down_s, round(r.5, 1) AS planned_down_s,
       if(r.2 + r.3 > 0, round(r.2 / (r.2 + r.3), 4), NULL) AS platform_share,
       if(r.4 + r.5 > 0, round(r.4 / (r.4 + r.5), 4), NULL) AS platform_down_share
FROM (
    SELECT arrayJoin(arrayPushBack(groupArray((job, platform_n, planned_n, platform_s, planned_s)),
                                   ('(all)', sum(platform_n), sum(planned_n), sum(platform_s), sum(planned_s)))) AS r
    FROM (
        -- the length of a union of spans sorted by start: each adds what it covers past the furthest end before it
        -- (ClickHouse 18.16's lambdas cannot read a column: the spans come in as arguments)
        SELECT job, platform_n, planned_n,
               arraySum(arrayMap((O, F) -> arraySum(arrayMap(i -> greatest(0., F[i] - greatest(O[i],
                            if(i = 1, O[1], arrayReduce('max', arraySlice(F, 1, i - 1))))), arrayEnumerate(O))),
                        [arrayMap(x -> x.1, down)], [arrayMap(x -> x.2, down)])) AS down_s,
               arraySum(arrayMap((O, F) -> arraySum(arrayMap(i -> greatest(0., F[i] - greatest(O[i],
                            if(i = 1, O[1], arrayReduce('max', arraySlice(F, 1, i - 1))))), arrayEnumerate(O))),
                        [arrayMap(x -> x.1, planned_down)], [arrayMap(x -> x.2, planned_down)])) AS planned_s,
               down_s - planned_s AS platform_s
        FROM (
            SELECT job, countIf(planned = 0) AS platform_n, countIf(planned = 1) AS planned_n,
                   arraySort(x -> x.1, groupArrayIf((o, e), planned = 1 OR stops = 1)) AS down,
                   arraySort(x -> x.1, groupArrayIf((o, e), planned = 1)) AS planned_down
            FROM (
                SELECT job, planned, class IN ('fail_stop', 'hang', 'stall', 'unknown') AS stops,
                       ifNull(onset_ts, ts) AS o,
                       least(ifNull(recovered_ts, 1e18), if({until} > 0, {until}, {data_end})) AS e
                FROM gw_incidents FINAL
                WHERE ({job} = '' OR job = {job}) AND ifNull(onset_ts, ts) >= {since}
                  AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
            )
            GROUP BY job
        )
    )
)
ORDER BY job = '(all)', job
