-- Stage budgets to revise: per stage that has a budget (triage/budgets.py Budgets; `decide` has none), in stage
-- order, how many unplanned incidents reached it, the median (p50) and p95 of its seconds (exact: the value at index
-- floor(q x n) of the n sorted ones, counted from 0), the budget in force (the parameter of the stage, by default
-- triage's) and how many took longer, then a suggested budget and how many would take longer than it. Suggested:
-- the p95, but at least 1.5 x the p50 (a tail shorter than that leaves no room for a slow but healthy case),
-- rounded up to a multiple of 5 s, and at least 5 s: about one incident in twenty runs over it.
-- param detect Float64 60: the detect budget in force, s
-- param localize Float64 300: the localize budget in force, s
-- param replace Float64 120: the replace budget in force, s
-- param rollback Float64 120: the rollback budget in force, s
-- param comm_rebuild Float64 60: the comm_rebuild budget in force, s
-- param total Float64 600: the total budget in force, s
-- param class String '': one incident class only ('': every class)
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, epoch s (0: no end)
SELECT stage, incidents, round(p50, 1) AS p50_s, round(p95, 1) AS p95_s, budget AS budget_s,
       arrayCount((x, b) -> x > b, xs, replicate(budget, xs)) AS over_budget,
       greatest(5., ceil(greatest(p95, 1.5 * p50) / 5) * 5) AS suggested_s,
       arrayCount((x, b) -> x > b, xs, replicate(suggested_s, xs)) AS over_suggested
FROM (
    SELECT stage, count() AS incidents, quantileExact(0.5)(seconds) AS p50, quantileExact(0.95)(seconds) AS p95,
           groupArray(seconds) AS xs,
           [{detect}, {localize}, {replace}, {rollback}, {comm_rebuild}, {total}][indexOf(
               ['detect', 'localize', 'replace', 'rollback', 'comm_rebuild', 'total'], stage)] AS budget
    FROM gw_incidents FINAL
    ARRAY JOIN stage_names AS stage, stage_seconds AS seconds
    WHERE planned = 0 AND has(['detect', 'localize', 'replace', 'rollback', 'comm_rebuild', 'total'], stage)
      AND ({class} = '' OR class = {class}) AND ifNull(onset_ts, ts) >= {since}
      AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
    GROUP BY stage
)
ORDER BY indexOf(['detect', 'localize', 'replace', 'rollback', 'comm_rebuild', 'total'], stage)
