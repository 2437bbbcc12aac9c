"""Templates cannot be injected: a placeholder inside the code that a shell (or python -c, perl -e) runs is
refused when the clusters file loads, with the argument form to use instead; elsewhere argv goes to the program
without a shell, so a placeholder inside a longer argument cannot change word boundaries."""

from __future__ import annotations

import pytest

from core.contracts.clusters import load_clusters
from core.engines.command import CommandEngineConfig

REFUSED = [
    ["sh", "-c", "train --data {data_path}"],
    ["bash", "-c", "cd {run_dir} && ./train.sh"],
    ["/bin/bash", "-ec", "train {seq_len}"],
    ["bash", "-o", "pipefail", "-c", "train {data_path} | tee log"],
    ["zsh", "-c", "train '{data_path}'"],  # quotes in a template do not help: the value may hold a quote
    ["env", "sh", "-c", "train {data_path}"],
    ["/usr/bin/env", "FOO=1", "dash", "-c", "train {data_path}"],
    ["srun", "bash", "-lc", "train {data_path}"],
    ["python3", "-c", "import os; os.system('train {data_path}')"],
    ["python3.12", "-u", "-c", "print('{lr}')"],
    ["perl", "-e", "system('train {data_path}')"],
    ["bash", "-c", "{precision_args}"],
]
ALLOWED = [
    ["sh", "-c", 'train --data "$1"', "sh", "{data_path}"],
    ["bash", "-c", 'exec python train.py --data "$1" --seq "$2"', "bash", "{data_path}", "{seq_len}"],
    ["bash", "/opt/megatron/train.sh", "{data_path}", "{seq_len}"],
    ["python3", "train.py", "-c", "{run_dir}/config.yaml"],  # -c of the script, not of python
    ["torchrun", "--nproc-per-node", "{nproc_per_node}", "train.py", "--data={data_path}", "--lr={lr}"],
    ["python3", "-u", "-m", "torch.distributed.run", "train.py", "{precision_args}"],
]


def _engine(argv: list[str]) -> CommandEngineConfig:
    return CommandEngineConfig(argv=argv, metrics="megatron-log", precisions=["bf16", "fp8-tensorwise"])


@pytest.mark.parametrize("argv", REFUSED)
def test_a_placeholder_inside_shell_code_is_refused_with_the_argument_form(argv) -> None:
    with pytest.raises(ValueError) as exc:
        _engine(argv)
    message = str(exc.value)
    assert "would be read as code" in message and '"sh", "-c", "train \\"$1\\"", "sh"' in message, message


@pytest.mark.parametrize("argv", ALLOWED)
def test_placeholders_as_arguments_are_allowed(argv) -> None:
    assert _engine(argv).argv == argv


def test_precision_args_are_checked_too() -> None:
    with pytest.raises(ValueError, match="read as code"):
        CommandEngineConfig(
            argv=["bash", "train.sh", "{precision_args}"],
            metrics="megatron-log",
            precisions=["bf16"],
            precision_args={"bf16": ["bash", "-c", "echo {data_path}"]},
        )


def test_the_clusters_file_is_refused_when_it_loads(tmp_path) -> None:
    f = tmp_path / "clusters.toml"
    f.write_text(
        '[[cluster]]\nname = "c"\nvendor = "cpu"\ndevice_name = "cpu"\ngpus_per_node = 1\n'
        '[cluster.engines.inject]\nargv = ["sh", "-c", "train {data_path}"]\nmetrics = "megatron-log"\n'
    )
    with pytest.raises(ValueError, match=r"(?s)cluster\[0\].*inside the code that sh runs"):
        load_clusters(f)
