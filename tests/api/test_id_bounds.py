"""Every id, in a path or a query, has the same bounds (api.deps.MAX_ID): a number beyond them is a 422 naming the
parameter, never a 500 (SQLite raised OverflowError binding `GET /regressions?suite=99999999999999999999`)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from api.deps import MAX_ID


@pytest.fixture(params=["postgres", "sqlite"])
def api(request, make_client, test_settings):
    if request.param == "sqlite":
        return make_client(replace(test_settings, database_url=request.getfixturevalue("sqlite_url")))
    return make_client(test_settings)


@pytest.mark.parametrize("suite", ["99999999999999999999", str(MAX_ID + 1), "0", "-1"])
def test_an_id_query_out_of_bounds_is_a_422_naming_it(api, suite) -> None:
    r = api.get(f"/regressions?suite={suite}")
    assert r.status_code == 422, r.text
    assert any(e["field"] == "query.suite" for e in r.json()["errors"]), r.text


@pytest.mark.parametrize(
    "path",
    ["/runs/{id}", "/experiments/{id}", "/suites/{id}", "/regressions/{id}", "/experiments/{id}/runs"],
)
def test_an_id_in_a_path_out_of_bounds_is_a_422(api, path) -> None:
    r = api.get(path.format(id="99999999999999999999"))
    assert r.status_code == 422, r.text


def test_an_id_query_in_bounds_reads(api) -> None:
    assert api.get(f"/regressions?suite={MAX_ID}").status_code == 200
