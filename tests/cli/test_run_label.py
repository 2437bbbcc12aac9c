"""The progress lines of `submit --wait`: every run's bar starts in the same column."""

from cli.runs import _engine_tag, _run_label


def test_run_labels_line_up_across_engines():
    runs = [
        {"id": 1, "engine": "scalebench", "precision": "bf16", "layout": "fsdp", "num_devices": 1},
        {"id": 2, "engine": "command:own-stack", "precision": "fp8-tensorwise", "layout": "fsdp", "num_devices": 2},
        {"id": 3, "engine": "torchtitan", "precision": "bf16", "layout": "tp=2+fsdp", "num_devices": 2, "seed": 1},
    ]
    width = max(len(_engine_tag(r)) for r in runs)
    labels = [_run_label(r, width) for r in runs]
    assert labels[0] == f"run    1 {'':<17} bf16            fsdp       N=1  "
    assert len(labels[0]) == len(labels[1]) == len(labels[2]) - len(" seed=1")
    assert labels[1].startswith("run    2 command:own-stack fp8-tensorwise")
    # every run the runner's: no engine column at all
    assert _run_label(runs[0], 0) == "run    1 bf16            fsdp       N=1  "
