"""How well gangwatch does, measured: the scored scenario suite, the game-day drills and the spares backtest.

- `scoring`: simulated scenarios with known faults, scored against floors (`gangwatch eval`);
- `drill` and `drill_live`: a game day of the live pipeline on a simulated job (`gangwatch drill`);
- `spares_backtest`: the spare-pool estimators replayed on histories (`gangwatch spares --evaluate`).
"""
