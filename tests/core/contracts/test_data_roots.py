"""A data root's path must itself be of the data_path form (core.contracts.data_paths.root_problem): a file's whole
real path, root included, fills command-engine templates, so a root with a space, ':' or a non-ASCII letter is
refused when the clusters file loads, not file by file at every request."""

from __future__ import annotations

from typing import Any

import pytest

from core.contracts import data_paths
from core.contracts.clusters import Cluster, load_clusters

BASE: dict[str, Any] = dict(name="c", vendor="cpu", device_name="cpu", gpus_per_node=1)


@pytest.mark.parametrize("root", ["/tmp/qa data/root", "/data/a:b", "/data/dätä", "/data/it's"])
def test_a_root_outside_the_path_characters_is_refused_with_the_reason(root) -> None:
    with pytest.raises(ValueError, match="data_roots") as exc:
        Cluster(**BASE, data_roots=[root])
    assert repr(root) in str(exc.value) and data_paths.PATH_CHARS in str(exc.value)
    assert "{data_path}" in str(exc.value)


def test_the_clusters_file_refuses_a_bad_root_and_keeps_the_path_characters(tmp_path) -> None:
    good = tmp_path / "qa-data_v1.2+x@y=z,%~"  # every character of the data_path form
    good.mkdir()
    (good / "x.bin").write_bytes(b"\0" * 64)
    path = tmp_path / "clusters.toml"
    table = '[[cluster]]\nname = "qa"\nvendor = "cpu"\ndevice_name = "cpu"\ngpus_per_node = 1\ndata_roots = ["{}"]\n'
    path.write_text(table.format(good))
    assert data_paths.resolve("x.bin", load_clusters(path)["qa"].data_roots) == good / "x.bin"
    path.write_text(table.format("/tmp/qa data/root"))
    with pytest.raises(ValueError, match=r"(?s)cluster\[0\].*data_roots: '/tmp/qa data/root' holds a character"):
        load_clusters(path)


def test_a_root_that_links_to_a_bad_directory_is_refused_by_its_real_path(tmp_path) -> None:
    bad = tmp_path / "qa data"
    bad.mkdir()
    (bad / "x.bin").write_bytes(b"\0" * 64)
    link = tmp_path / "good-name"
    link.symlink_to(bad)
    with pytest.raises(ValueError, match="data_roots") as exc:
        Cluster(**BASE, data_roots=[str(link)])
    assert repr(str(bad)) in str(exc.value) and "symlinks resolved" in str(exc.value)
    # a link to a good directory still loads, and serves its files by their real path
    good = tmp_path / "real-data"
    good.mkdir()
    (good / "x.bin").write_bytes(b"\0" * 64)
    link2 = tmp_path / "data-link"
    link2.symlink_to(good)
    assert data_paths.resolve("x.bin", Cluster(**BASE, data_roots=[str(link2)]).data_roots) == good / "x.bin"
