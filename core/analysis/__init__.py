"""The answers, computed from results: scaling curves and fits, summaries, the fp8 loss verdict, regressions,
step-time breakdowns."""
