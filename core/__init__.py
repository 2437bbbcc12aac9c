"""The pure domain of scalebench: standard library and pydantic only (tests/test_imports.py enforces it).

contracts/   what travels between the parts: ExperimentSpec, RunSpec, RunResult (specs), the clusters file
             (clusters), matrix expansion (matrix), cron schedules (cron), the webhook target rule
             (webhook_targets), and the two pydantic bases (base)
catalog/     tables of the world, each with its sources: Llama-3 shapes and FLOPs per token (shapes), device
             peak TFLOP/s (hardware)
engines/     the engines a run can measure: the name -> program table and what each can run (registry), the
             operator's command engines (command), the log formats their metrics are read from (logs)
analysis/    what the answers are made of: scaling curves (scaling) and their fits (fits), the run summary
             arithmetic (summary), the fp8 loss verdict (numerics), regression detection (regression), the
             step-time breakdown (breakdown)
projection/  beyond the measured GPU counts: cluster networks (network), the step model (step_model), the
             projection (model), the token-budget plan (plan) and the fitted constants (constants)
settings     every setting of the service, from the environment
"""
