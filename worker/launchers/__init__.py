"""Launchers start the runner for one run on a cluster and report its outcome (local torchrun, Slurm)."""
