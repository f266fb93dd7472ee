-- Stage budgets against what was observed: per stage (in stage order), how many unplanned incidents reached it,
-- the median (p50) and p95 of its seconds, the longest, and how many ran over the stage's budget. A stage whose
-- p95 sits far below its budget, or whose over-budget count grows, is a budget to revise (triage.budgets.*).
-- Quantiles are exact: p50 of n sorted values is the value at index floor(0.5 * n), counted from 0.
-- param class String '': one incident class only ('': every class)
-- param job String '': one job only ('': every job); a week: since/until of its Monday and the next
-- param since Float64 0: onsets at or after this, epoch s
-- param until Float64 0: onsets before this, epoch s (0: no end)
SELECT stage, count() AS incidents, round(quantileExact(0.5)(seconds), 1) AS p50_s,
       round(quantileExact(0.95)(seconds), 1) AS p95_s, round(max(seconds), 1) AS max_s,
       countIf(has(over_budget, stage)) AS over_budget
FROM gw_incidents FINAL
ARRAY JOIN stage_names AS stage, stage_seconds AS seconds
WHERE planned = 0 AND ({class} = '' OR class = {class}) AND ({job} = '' OR job = {job})
  AND ifNull(onset_ts, ts) >= {since}
  AND ({until} = 0 OR ifNull(onset_ts, ts) < {until})
GROUP BY stage
ORDER BY indexOf(['detect', 'localize', 'decide', 'replace', 'rollback', 'comm_rebuild', 'total'], stage), stage
