"""The post-mortem: what a store says about one incident, a job or a period, as text, as an HTML page with
plots chosen by the incident's class, and the analysts' shipped SQL.

- `postmortem`: the model, gathered from a store (incidents, stages against budgets, evidence, ETTR);
- `text`: it as plain text (`gangwatch report`);
- `figures`: the plots' data, pure (which series is the culprit, which steps are masked);
- `htmlpage`: it as one self-contained HTML page (`gangwatch report --html`);
- `queries` and `sql/`: the shipped, parameterised queries (`gangwatch sql`).
"""
