"""bench/time_to_loss_gpu.py on CPU: the node's cluster lets the experiment name the corpus (its data root)."""

from __future__ import annotations

import argparse
import json

from bench import time_to_loss_gpu as ttl
from core.contracts import data_paths
from core.contracts.clusters import load_clusters


def test_the_node_cluster_has_the_corpus_directory_as_its_data_root(tmp_path):
    corpus = tmp_path / "tokens" / "c.bin"
    corpus.parent.mkdir()
    corpus.write_bytes(b"\0\0")
    corpus.with_suffix(".json").write_text(json.dumps({"tokenizer": {"vocab_size": 32000}}))
    toml = tmp_path / "clusters.toml"
    toml.write_text(ttl.clusters_toml("NVIDIA H200", smoke=False, data=corpus))
    cluster = load_clusters(toml)["gpu-node"]
    assert cluster.data_roots == [str(corpus.parent)] and cluster.torchtitan
    args = argparse.Namespace(
        engine="scalebench", precisions=["bf16", "fp8-rowwise"], seeds=[0], repeats=2, layers=2, seq_len=8192,
        steps=1000, warmup=10, lr=3e-4, lr_warmup=100, eval_every=50, eval_batches=4, data=corpus,
        run_timeout_s=900, smoke=False,
    )  # fmt: skip
    spec = ttl.experiment_spec(args)
    assert spec["repeats"] == 2 and spec["vocab_size"] == 32000
    assert data_paths.resolve(spec["data_path"], cluster.data_roots) == corpus
